"""Walk a setting through trainkit: which functions a value passes, in which files, and how often it is parsed.

Each walk runs one small scenario in a fresh process (a launcher flag, an ``Accelerator(...)`` argument, a
``TrainingArguments`` field, ...) under cProfile, from the moment the user's value enters trainkit to the
first training step that uses it. A *stop* is an executed trainkit function whose own code names the setting
(an identifier, an attribute or a string containing one of the walk's tokens); *files* are their files;
*parses* are the runtime calls of the functions that parse or validate that setting. Deterministic: no
timing is read, so the figures can be compared between two trees on a loaded machine.

    python scripts/setting_walks.py                      # this tree
    python scripts/setting_walks.py --tree /path/to/other/checkout --json
    python scripts/setting_walks.py --only mixed_precision_launcher --list

Used for issue #36's before/after table (docs/architecture.md, "Setting walks").
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import subprocess
import sys
import tempfile
import textwrap
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent

# The model, optimizer and data every engine scenario uses, and the tiny Trainer set-up.
_COMMON = """
import torch
from torch import nn

def model_and_data():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(16, 4), torch.randn(16, 1)),
                                       batch_size=4)
    return model, optimizer, data

def engine_steps(accelerator, steps=2):
    model, optimizer, data = accelerator.prepare(*model_and_data())
    for index, (x, y) in enumerate(data):
        with accelerator.accumulate(model):
            loss = nn.functional.mse_loss(model(x), y)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
        if index + 1 >= steps:
            break

class Rows(torch.utils.data.Dataset):
    def __len__(self):
        return 16
    def __getitem__(self, i):
        return {"x": torch.full((4,), float(i) / 16), "labels": torch.tensor(float(i % 3))}

class Regressor(nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = nn.Linear(4, 1)
    def forward(self, x, labels=None):
        out = self.layer(x).squeeze(-1)
        return {"loss": ((out - labels) ** 2).mean(), "logits": out}

def trainer_args(output_dir, **fields):
    from trainkit import TrainingArguments
    base = dict(output_dir=output_dir, per_device_train_batch_size=4, max_steps=2, save_strategy="no",
                report_to="none", disable_tqdm=True, use_cpu=True, logging_steps=1)
    base.update(fields)
    return TrainingArguments(**base)

def train(args, **call):
    from trainkit import Trainer
    return Trainer(model=Regressor(), args=args, train_dataset=Rows()).train(**call)

def launch(*flags):
    # `trainkit launch FLAGS script.py`, the one-process path run in this process instead of exec'd.
    import runpy
    from trainkit.cli import launch_command
    from trainkit.cli.main import build_parser
    def in_this_process(args, replace_process):  # the child's environment, then its script, here
        os.environ.update(launch_command.prepare_simple_launcher_cmd_env(args)[1])
        runpy.run_path(args.training_script, run_name="__main__")
        return 0
    launch_command._run_single_process = in_this_process
    script = os.path.join(WORK, "script.py")
    with open(script, "w") as handle:
        handle.write(SCRIPT)
    return launch_command.run(build_parser().parse_args(["launch", *flags, script]))
"""

_ENGINE_SCRIPT = """
import sys
sys.path.insert(0, {work!r})
from common import engine_steps
from trainkit import Accelerator
engine_steps(Accelerator())
"""


@dataclass(frozen=True)
class Walk:
    """One scenario: the code that sets the value and runs it, the tokens that name the setting, its parsers."""

    name: str
    description: str
    code: str
    tokens: tuple[str, ...]
    parsers: tuple[str, ...]


WALKS = [
    Walk("mixed_precision_launcher", "trainkit launch --mixed_precision bf16 (one process) -> Accelerator() step",
         'launch("--mixed_precision", "bf16")', ("mixed_precision", "bf16"),
         ("parse_mixed_precision", "check_precision_device")),
    Walk("mixed_precision_accelerator", "Accelerator(mixed_precision='bf16') -> prepare -> step",
         'from trainkit import Accelerator\nengine_steps(Accelerator(mixed_precision="bf16"))',
         ("mixed_precision", "bf16"), ("parse_mixed_precision", "check_precision_device")),
    Walk("mixed_precision_trainer", "TrainingArguments(bf16=True) -> Trainer.train (2 steps)",
         'train(trainer_args(WORK, bf16=True))', ("mixed_precision", "bf16"),
         ("parse_mixed_precision", "check_precision_device")),
    Walk("accumulation_trainer", "TrainingArguments(gradient_accumulation_steps=2) -> Trainer.train (2 steps)",
         'train(trainer_args(WORK, gradient_accumulation_steps=2))', ("gradient_accumulation", "accumulation_steps"),
         ("keep_global_batch", "open_accumulation_window")),
    Walk("accumulation_launcher", "trainkit launch --gradient_accumulation_steps 2 -> Accelerator() accumulate",
         'launch("--gradient_accumulation_steps", "2")', ("gradient_accumulation", "accumulation_steps"),
         ("open_accumulation_window",)),
    Walk("fsdp_trainer", "TrainingArguments(fsdp='full_shard', fsdp_config={...}) -> Trainer.train (1 process)",
         'train(trainer_args(WORK, fsdp="full_shard", fsdp_config={"min_num_params": 0, "backward_prefetch": '
         '"backward_post"}))', ("fsdp", "sharding_strategy", "backward_prefetch", "min_num_params"),
         ("parse_option", "FSDPOptions.__post_init__", "FSDPOptions.validate", "FSDPOptions.from_parsed")),
    Walk("parallelism_launcher", "trainkit launch --parallelism_config_dp_replicate_size 1 -> Accelerator() step",
         'launch("--parallelism_config_dp_replicate_size", "1")', ("parallelism", "dp_replicate"),
         ("ParallelismConfig.__post_init__", "ParallelismConfig.from_mapping", "parse_parallelism",
          "ParallelismConfig.resolved")),
    Walk("parallelism_trainer", "TrainingArguments(parallelism_config=ParallelismConfig(dp_replicate_size=1)) -> train",
         'from trainkit import ParallelismConfig\n'
         'train(trainer_args(WORK, parallelism_config=ParallelismConfig(dp_replicate_size=1)))',
         ("parallelism", "dp_replicate"), ("ParallelismConfig.__post_init__", "ParallelismConfig.from_mapping",
                                          "parse_parallelism", "ParallelismConfig.resolved")),
    Walk("async_save_trainer", "TrainingArguments(async_save=True, save_steps=1) -> Trainer.train (2 saves)",
         'train(trainer_args(WORK, async_save=True, save_strategy="steps", save_steps=1))', ("async_save",),
         ("check_async_save_when_busy", "parse_async_save_when_busy", "parse_async_save")),
    Walk("resume_trainer", "Trainer.train(resume_from_checkpoint=True) after a 2-step run with a save",
         'PRE = lambda: train(trainer_args(WORK, save_strategy="steps", save_steps=2))\n'
         'train(trainer_args(WORK, save_strategy="steps", save_steps=2, max_steps=3), resume_from_checkpoint=True)',
         ("resume",), ("find_resume_folder", "latest_checkpoint", "keep_global_batch")),
]

_RUNNER = """
import cProfile, json, os, sys, tempfile
WORK = {work!r}
sys.path.insert(0, WORK)
os.chdir(WORK)
SCRIPT = {script!r}
exec(open(os.path.join(WORK, "common.py")).read())
import trainkit, trainkit.cli.launch_command, trainkit.cli.main
from trainkit import Accelerator, Trainer, TrainingArguments  # imported before profiling: walks, not imports
import trainkit.engine.strategies.single, trainkit.engine.precision.amp
namespace = dict(globals())
code = {code!r}
if "PRE = " in code:  # a set-up run (e.g. the checkpoint to resume from), outside the profile
    exec(code.split("\\n")[0], namespace)
    namespace["PRE"]()
    code = "\\n".join(code.split("\\n")[1:])
profile = cProfile.Profile()
profile.enable()
exec(code, namespace)
profile.disable()
profile.create_stats()
root = os.path.dirname(trainkit.__file__)
calls = [[file, line, name, stats[1]] for (file, line, name), stats in profile.stats.items()
         if file.startswith(root)]
print("WALK-RESULT " + json.dumps({{"root": root, "calls": calls}}))
"""


def _tokens_of(node: ast.AST) -> set[str]:
    """Identifiers, attributes, argument and keyword names and string constants in a function's own body."""
    found: set[str] = set()
    stack = list(ast.iter_child_nodes(node))
    while stack:
        child = stack.pop()
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue  # a nested function is its own stop
        if isinstance(child, ast.Name):
            found.add(child.id)
        elif isinstance(child, ast.Attribute):
            found.add(child.attr)
        elif isinstance(child, ast.arg):
            found.add(child.arg)
        elif isinstance(child, ast.keyword) and child.arg:
            found.add(child.arg)
        elif isinstance(child, ast.Constant) and isinstance(child.value, str) and len(child.value) < 80:
            found.add(child.value)  # keys and flag names, not messages
        stack.extend(ast.iter_child_nodes(child))
    return found


def _functions(path: str) -> dict[tuple[int, str], tuple[str, ast.AST]]:
    """(first line, name) -> (qualified name, node) for every function of a file."""
    tree = ast.parse(Path(path).read_text(encoding="utf-8"))
    found: dict[tuple[int, str], tuple[str, ast.AST]] = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                entry = (prefix + child.name, child)
                found[(child.lineno, child.name)] = entry
                if child.decorator_list:  # cProfile names a decorated function by its first decorator's line
                    found[(child.decorator_list[0].lineno, child.name)] = entry
                visit(child, prefix + child.name + ".")
            elif isinstance(child, ast.ClassDef):
                visit(child, prefix + child.name + ".")
            else:
                visit(child, prefix)

    visit(tree, "")
    return found


def run_walk(walk: Walk, tree: Path) -> dict:
    """Run one walk against ``tree``; return its stops, files and parse counts."""
    with tempfile.TemporaryDirectory(prefix="walk-") as work:
        Path(work, "common.py").write_text("import os\nWORK = " + repr(work) + "\n" + _COMMON)
        script = _ENGINE_SCRIPT.format(work=work)
        runner = _RUNNER.format(work=work, script=script, code=walk.code)
        env = dict(os.environ, PYTHONPATH=str(tree), HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1",
                   TRAINKIT_LAUNCH_CONFIG="", WANDB_MODE="disabled")
        env.pop("TRAINKIT_LAUNCH_CONFIG")
        result = subprocess.run([sys.executable, "-c", runner], capture_output=True, text=True, env=env,
                                cwd=work, timeout=600)
    lines = [line for line in result.stdout.splitlines() if line.startswith("WALK-RESULT ")]
    if result.returncode != 0 or not lines:
        raise RuntimeError(f"walk {walk.name} failed:\n{result.stdout[-2000:]}\n{result.stderr[-4000:]}")
    payload = json.loads(lines[-1][len("WALK-RESULT "):])
    root = Path(payload["root"])
    parsed: dict[str, dict] = {}
    stops: list[str] = []
    parses: dict[str, int] = {}
    for file, line, name, count in sorted(payload["calls"]):
        if name.startswith("<"):
            continue  # module bodies, comprehensions, lambdas: part of their enclosing function
        functions = parsed.setdefault(file, _functions(file))
        if (line, name) not in functions:
            continue
        qualname, node = functions[(line, name)]
        for parser in walk.parsers:
            if parser in (name, qualname):
                parses[parser] = parses.get(parser, 0) + count
        tokens = _tokens_of(node)
        if any(token in word for word in tokens for token in walk.tokens):
            stops.append(f"{Path(file).relative_to(root.parent)}:{name}")
    files = sorted({stop.split(":")[0] for stop in stops})
    return {"walk": walk.name, "description": walk.description, "stops": len(stops), "files": len(files),
            "parses": sum(parses.values()), "parse_calls": parses, "stop_list": stops, "file_list": files}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tree", default=str(HERE.parent), help="checkout whose trainkit is walked")
    parser.add_argument("--only", default=None, help="comma-separated walk names")
    parser.add_argument("--list", action="store_true", help="print every stop")
    parser.add_argument("--json", action="store_true", help="one JSON line per walk")
    args = parser.parse_args()
    chosen = [walk for walk in WALKS if args.only is None or walk.name in args.only.split(",")]
    for walk in chosen:
        result = run_walk(walk, Path(args.tree).resolve())
        if args.json:
            print(json.dumps(result))
            continue
        print(f"{walk.name}: {result['stops']} stops, {result['files']} files, {result['parses']} parses "
              f"{result['parse_calls']}  ({walk.description})")
        if args.list:
            print(textwrap.indent("\n".join(result["stop_list"]), "    "))


if __name__ == "__main__":
    main()
