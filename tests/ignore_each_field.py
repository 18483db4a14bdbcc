"""The ignore-one-field check: every proof fails when trainkit ignores its setting (CPU; 4-9 minutes on 2 shared cores).

Not part of the suite (the name does not start with ``test_``): run it as
``python -m pytest tests/ignore_each_field.py`` (``-k seed`` for one field). For every ``TrainingArguments`` field
(tests/trainer/test_field_effects.py) and every ``Accelerator`` keyword (tests/engine/test_accelerator_keyword_effects.py)
it runs the proof with ``TRAINKIT_IGNORE_FIELD=<Class>.<name>`` (trainkit/config/ignored_field.py: trainkit then uses
the default instead of the value given, in this process and in the workers it launches). A case passes when the
proof fails; it fails, saying so, when the proof still passes. Proofs that need a CUDA device are skipped on a
machine without one, as in the suite. The summary at the end lists how each proof failed.
"""

from __future__ import annotations

import pytest

from tests.engine import test_accelerator_keyword_effects as keywords
from tests.proofs import case, run_proof
from tests.trainer import test_field_effects as fields
from trainkit.config.ignored_field import ENV_VAR
from trainkit.trainer.training_arguments import checks as argument_checks

OUTCOMES: dict[str, str] = {}


def cases() -> list:
    return [case(f"TrainingArguments.{name}", proof) for name, proof in fields.PROOFS.items()] + \
           [case(f"Accelerator.{name}", proof) for name, proof in keywords.PROOFS.items()]


@pytest.fixture(scope="module", autouse=True)
def summary(request):
    yield
    lines = [f"ignore-one-field: {len(OUTCOMES)} settings run"]
    for outcome in sorted(set(OUTCOMES.values())):
        names = sorted(name for name, seen in OUTCOMES.items() if seen == outcome)
        lines.append(f"  {outcome}: {len(names)}: {', '.join(names)}")
    with request.config.pluginmanager.get_plugin("capturemanager").global_and_fixture_disabled():
        print("\n" + "\n".join(lines))


@pytest.mark.parametrize("setting, proof", cases())
def test_the_proof_fails_without_its_setting(setting, proof, request, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)  # the default output_dir of an ignored one lands here
    monkeypatch.setenv(ENV_VAR, setting)
    owner = setting.partition(".")[0]
    build = fields.build_arguments if owner == "TrainingArguments" else keywords.build_accelerator
    try:
        run_proof(proof, request, build, argument_checks._WARNED.clear)
    except pytest.skip.Exception as skipped:
        OUTCOMES[setting] = "skipped"
        raise skipped
    except (AssertionError, pytest.fail.Exception):
        OUTCOMES[setting] = "fails at its assertion"
        return
    except Exception as error:  # noqa: BLE001 - any error shows the run needs the setting; the summary names its kind
        OUTCOMES[setting] = f"fails with {type(error).__name__}"
        return
    OUTCOMES[setting] = "STILL PASSES"
    pytest.fail(f"the proof of {setting} passes while trainkit ignores it: it does not show the effect")
