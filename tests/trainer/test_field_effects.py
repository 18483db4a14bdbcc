"""Every TrainingArguments field acts, or says it does not (CPU, one process; one test on 2 gloo ranks).

``PROOFS`` holds one proof per field, and a field without one fails ``test_every_field_has_a_proof``, so a new
field cannot arrive silently. A proof is one of:
- a check run here: a short run that differs from the default, or an assertion on what the field configures;
- ``Warns(...)``: the field cannot change anything here, and constructing it logs one line naming it and why;
- ``Elsewhere("file::test")``: a test that already proves the effect (the test must exist);
- ``FOR_SCRIPTS``: read by the user's script, not by any Trainer (transformers' Trainer ignores it too).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
from pathlib import Path
from typing import Any, Callable, NamedTuple

import pytest
import torch

from tests.distributed import run_torchrun
from tests.trainer.checkpoint_workload import RegressionData, final_weights, make_trainer
from trainkit import TrainerCallback, TrainingArguments
from trainkit.trainer import argument_checks

pytestmark = pytest.mark.timeout(300)
TESTS = Path(__file__).resolve().parents[1]
QUICK = dict(max_steps=2, save_strategy="no", eval_strategy="no")


class Warns(NamedTuple):
    kwargs: dict[str, Any]
    text: str


class Elsewhere(NamedTuple):
    test: str  # "trainer/test_x.py::test_name", relative to tests/


FOR_SCRIPTS = "for scripts"


def quick(tmp_path, **extra):
    """The checkpoint workload, 2 steps, no saves or evaluations unless asked (CPU)."""
    return make_trainer(str(tmp_path / "out"), **{**QUICK, **extra})


def differs_from_default(tmp_path, **extra) -> None:
    """Train 2 steps with and without ``extra``: the final weights differ."""
    base, changed = quick(tmp_path / "a"), quick(tmp_path / "b", **extra)
    base.train()
    changed.train()
    a, b = final_weights(base), final_weights(changed)
    assert any(not torch.equal(a[key], b[key]) for key in a), f"{extra} trained exactly like the default"


def log_steps(trainer, key: str) -> list[int]:
    return [entry["step"] for entry in trainer.state.log_history if key in entry]


def optimizer_group(trainer) -> dict[str, Any]:
    trainer.create_optimizer()
    return trainer.optimizer.param_groups[0]


# --- the proofs run here ------------------------------------------------------------------------------
def p_output_dir(tmp_path):
    trainer = quick(tmp_path / "elsewhere")
    trainer.save_model()
    assert (tmp_path / "elsewhere" / "out" / "model.safetensors").exists()


def p_train_batch(tmp_path):
    assert len(quick(tmp_path, per_device_train_batch_size=4).get_train_dataloader()) == 11  # 44 samples (default 2: 22)


def p_eval_batch(tmp_path):
    assert len(quick(tmp_path, per_device_eval_batch_size=8).get_eval_dataloader()) == 1  # 8 samples (default 4: 2)


def p_epochs(tmp_path):
    assert quick(tmp_path, max_steps=-1, num_train_epochs=1).train().global_step == 8  # default 2 epochs: 16


def p_max_steps(tmp_path):
    assert quick(tmp_path, max_steps=3).train().global_step == 3


def p_accumulation(tmp_path):
    assert quick(tmp_path, max_steps=-1, num_train_epochs=1, gradient_accumulation_steps=1).train().global_step == 22


def p_lr(tmp_path):
    assert optimizer_group(quick(tmp_path, learning_rate=0.125))["lr"] == 0.125


def p_weight_decay(tmp_path):
    assert optimizer_group(quick(tmp_path, weight_decay=0.25))["weight_decay"] == 0.25


def p_betas(tmp_path):
    group = optimizer_group(quick(tmp_path, adam_beta1=0.5, adam_beta2=0.75, adam_epsilon=0.125))
    assert group["betas"] == (0.5, 0.75) and group["eps"] == 0.125


def p_max_grad_norm(tmp_path):
    differs_from_default(tmp_path, max_grad_norm=1e-4)


def p_optim(tmp_path):
    quick_sgd = quick(tmp_path, optim="sgd", optim_args="momentum=0.5")
    group = optimizer_group(quick_sgd)
    assert isinstance(quick_sgd.optimizer, torch.optim.SGD) and group["momentum"] == 0.5


def p_scheduler(tmp_path):
    trainer = quick(tmp_path, lr_scheduler_type="constant", warmup_steps=0)
    trainer.train()
    assert trainer.lr_scheduler.get_last_lr()[0] == trainer.args.learning_rate  # linear (default) decays to 0


def p_warmup(tmp_path):
    trainer = quick(tmp_path, max_steps=4, warmup_steps=2, logging_steps=1)
    trainer.train()
    # Each log names the rate its step used (as transformers logs it): step 1 of 2 warmup steps runs at 0.
    rates = [entry["learning_rate"] for entry in trainer.state.log_history if "loss" in entry]
    assert rates[:3] == pytest.approx([0.0, trainer.args.learning_rate / 2, trainer.args.learning_rate])


def p_warmup_ratio(tmp_path):
    trainer = quick(tmp_path, max_steps=4, warmup_steps=0, warmup_ratio=0.5, logging_steps=1)  # 5.1: warmup_steps=0 is unset
    trainer.train()
    rates = [entry["learning_rate"] for entry in trainer.state.log_history if "loss" in entry]  # the rate each step used
    assert rates[:3] == pytest.approx([0.0, trainer.args.learning_rate / 2, trainer.args.learning_rate])


def p_precision(tmp_path):
    assert quick(tmp_path, bf16=True).accelerator.mixed_precision == "bf16"
    assert quick(tmp_path / "fp16", fp16=True, use_cpu=True).accelerator.scaler is not None


def p_use_cpu(tmp_path):
    trainer = quick(tmp_path, use_cpu=True)
    assert trainer.accelerator.device.type == "cpu" and trainer.accelerator.config.use_cpu


def p_seed(tmp_path):
    a, b = quick(tmp_path / "a"), quick(tmp_path / "b", seed=12)
    assert not torch.equal(a.model.layers[0].weight, b.model.layers[0].weight)  # model_init runs after the seed


def p_data_seed(tmp_path):
    def first_batch(trainer):
        return next(iter(trainer.get_train_dataloader()))["x"]

    assert not torch.equal(first_batch(quick(tmp_path / "a")), first_batch(quick(tmp_path / "b", data_seed=5)))


def p_logging(tmp_path):
    every_two = quick(tmp_path / "b", max_steps=4, logging_steps=2)
    every_two.train()
    assert log_steps(every_two, "loss") == [2, 4]
    none = quick(tmp_path / "c", max_steps=4, logging_strategy="no")
    none.train()
    assert log_steps(none, "loss") == []
    first = quick(tmp_path / "d", max_steps=4, logging_steps=3, logging_first_step=True)
    first.train()
    assert log_steps(first, "loss") == [1, 3]


def token_trainer(tmp_path, **extra):
    """TinyTokenModel on TokenDataset (input_ids and labels), CPU."""
    from tests.trainer.helpers import TinyTokenModel, TokenDataset
    from trainkit import Trainer

    torch.manual_seed(0)
    args = TrainingArguments(str(tmp_path / "tokens"), max_steps=2, per_device_train_batch_size=2, save_strategy="no",
                             report_to="none", disable_tqdm=True, logging_steps=1, **extra)
    return Trainer(model=TinyTokenModel(), args=args, train_dataset=TokenDataset(8), eval_dataset=TokenDataset(4),
                   )


def p_tokens_seen(tmp_path):
    trainer = token_trainer(tmp_path, include_num_input_tokens_seen="all")
    trainer.train()
    assert trainer.state.num_input_tokens_seen > 0
    default = token_trainer(tmp_path / "b")
    default.train()
    assert default.state.num_input_tokens_seen == 0


def p_log_level(tmp_path):
    quick(tmp_path, log_level="error")
    assert logging.getLogger("trainkit").level == logging.ERROR
    logging.getLogger("trainkit").setLevel(logging.NOTSET)


def p_disable_tqdm(tmp_path):
    names = {type(cb).__name__ if not isinstance(cb, type) else cb.__name__
             for cb in quick(tmp_path, disable_tqdm=False).callback_handler.callbacks}
    assert "ProgressCallback" in names


def p_run_name(tmp_path):
    quick(tmp_path, run_name="named").train()
    assert (tmp_path / "out" / "named" / "metrics.jsonl").exists()


def p_report_to(tmp_path):
    from trainkit.engine.tracking import OPTIONAL_TRACKERS as _OPTIONAL

    installed = [name for name, (_, available) in _OPTIONAL.items() if available() and name != "wandb"]
    if not installed:
        pytest.skip("no optional tracker installed: report_to accepts the names (test_engine_agreement.py)")
    assert quick(tmp_path, report_to=installed[0]).accelerator.log_with == [installed[0]]


def p_eval(tmp_path):
    trainer = quick(tmp_path, max_steps=4, eval_strategy="steps", eval_steps=2, eval_delay=3, eval_on_start=True)
    trainer.train()
    assert log_steps(trainer, "eval_loss") == [0, 4]  # on start; step 2 is before the delay


def p_prediction_loss_only(tmp_path):
    output = quick(tmp_path, prediction_loss_only=True).predict(RegressionData(4))
    assert output.predictions is None


def p_include_for_metrics(tmp_path):
    from tests.trainer.helpers import TinyTokenModel, TokenDataset
    from trainkit import Trainer

    seen = {}

    def metrics(prediction):
        seen["inputs"] = prediction.inputs
        return {}

    args = TrainingArguments(str(tmp_path), include_for_metrics=["inputs"], report_to="none", disable_tqdm=True)
    Trainer(model=TinyTokenModel(), args=args, compute_metrics=metrics).evaluate(TokenDataset(4))
    assert seen["inputs"] is not None and len(seen["inputs"]) == 4


def p_save(tmp_path):
    trainer = quick(tmp_path, max_steps=4, save_strategy="steps", save_steps=2, save_total_limit=1)
    trainer.train()
    assert sorted(os.listdir(tmp_path / "out")) == ["checkpoint-4", "logs"]


def p_best(tmp_path):
    scores = iter([3.0, 1.0, 2.0, 0.5])

    trainer = quick(tmp_path, max_steps=4, eval_strategy="steps", eval_steps=1, save_strategy="steps", save_steps=1,
                    load_best_model_at_end=True, metric_for_best_model="score", greater_is_better=True,
                    compute_metrics=lambda prediction: {"score": next(scores)})
    trainer.train()
    assert trainer.state.best_model_checkpoint.endswith("checkpoint-1") and trainer.state.best_metric == 3.0


def p_label_names(tmp_path):
    assert quick(tmp_path, label_names=["labels", "x"]).label_names == ["labels", "x"]


def p_dataloader(tmp_path):
    loader = quick(tmp_path, dataloader_drop_last=True, per_device_train_batch_size=5).get_train_dataloader()
    assert len(loader) == 8  # 44 samples in batches of 5: the short ninth is dropped
    workers = quick(tmp_path / "w", dataloader_num_workers=1, dataloader_persistent_workers=True,
                    dataloader_prefetch_factor=3, dataloader_multiprocessing_context="spawn",
                    dataloader_in_order=False, dataloader_pin_memory=False).get_train_dataloader()
    inner = workers.base_dataloader if hasattr(workers, "base_dataloader") else workers
    assert (inner.num_workers, inner.persistent_workers, inner.prefetch_factor, inner.in_order) == (1, True, 3, False)
    assert inner.multiprocessing_context.get_start_method() == "spawn" and inner.pin_memory is False


def p_average_tokens(tmp_path):
    """2 gloo ranks whose label counts differ: the mean over all items (default) and the mean of the ranks' means
    (False) train differently; on one process they are the same thing."""
    run_torchrun(Path(__file__).with_name("fields_effects_worker.py"), str(tmp_path), nproc=2, timeout=200)
    from safetensors.torch import load_file

    a, b = load_file(str(tmp_path / "across.safetensors")), load_file(str(tmp_path / "local.safetensors"))
    assert any(not torch.equal(a[key], b[key]) for key in a)


def p_hub(tmp_path, monkeypatch):
    """A recording stand-in for huggingface_hub.HfApi: what each hub_* field sends (no network)."""
    import huggingface_hub

    calls: list[tuple[str, dict]] = []

    class RecordingApi:
        def __init__(self, token=None):
            calls.append(("token", {"token": token}))

        def create_repo(self, repo_id, **kwargs):
            calls.append(("create_repo", {"repo_id": repo_id, **kwargs}))
            return f"https://hub.invalid/{repo_id}"

        def upload_folder(self, **kwargs):
            calls.append(("upload_folder", kwargs))

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(huggingface_hub, "HfApi", RecordingApi)
    trainer = quick(tmp_path, max_steps=2, save_strategy="steps", save_steps=1, push_to_hub=True,
                    hub_model_id="me/model", hub_token="hf_token", hub_private_repo=True, hub_revision="dev",
                    hub_strategy="checkpoint")
    trainer.train()
    created = [kwargs for kind, kwargs in calls if kind == "create_repo"][0]
    assert created["repo_id"] == "me/model" and created["private"] is True
    assert {"token": "hf_token"} in [kwargs for kind, kwargs in calls if kind == "token"]
    uploads = [kwargs for kind, kwargs in calls if kind == "upload_folder"]
    assert [u["path_in_repo"] for u in uploads] == ["checkpoint-1", "checkpoint-2"]  # hub_strategy="checkpoint"
    assert {u["revision"] for u in uploads} == {"dev"}


def p_callback_states(tmp_path):
    from trainkit.trainer import ExportableState

    class Counter(TrainerCallback, ExportableState):  # stored in trainer_state.json, as transformers stores one
        def __init__(self):
            self.count = 0

        def on_step_end(self, args, state, control, **kwargs):
            self.count += 1

        def state(self):
            return {"args": {}, "attributes": {"count": self.count}}

    first = make_trainer(str(tmp_path / "out"), max_steps=2, stop_after=2, eval_strategy="no")
    first.add_callback(Counter())
    first.train()
    for restore, expected in ((True, 2 + 2), (False, 2)):
        resumed = make_trainer(str(tmp_path / "out"), max_steps=4, eval_strategy="no",
                               restore_callback_states_from_checkpoint=restore)
        resumed.add_callback(Counter())
        resumed.train(resume_from_checkpoint=str(tmp_path / "out" / "checkpoint-2"))
        counter = resumed.pop_callback(Counter)  # restoring rebuilds the callback from its state, as transformers does
        assert counter.count == expected, restore


def p_nan_filter(tmp_path):
    class NaNAtStep2(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            self.trainer.model.layers[0].weight.data.fill_(float("nan") if state.global_step == 1 else 0.1)

    def run(nan_filter):
        trainer = quick(tmp_path / str(nan_filter), max_steps=2, logging_steps=2, max_grad_norm=0,
                        logging_nan_inf_filter=nan_filter)
        callback = NaNAtStep2()
        callback.trainer = trainer
        trainer.add_callback(callback)
        trainer.train()
        return [entry["loss"] for entry in trainer.state.log_history if "loss" in entry][0]

    assert run(True) == run(True) and not torch.isnan(torch.tensor(run(True)))
    assert torch.isnan(torch.tensor(run(False)))


def p_compile(tmp_path):
    trainer = quick(tmp_path, torch_compile_backend="eager", torch_compile_mode="default")
    plugin = trainer.accelerator.dynamo_plugin
    assert trainer.args.torch_compile and str(plugin.backend).lower().endswith("eager") and plugin.mode == "default"


def p_ignore_data_skip(tmp_path):
    """Resumed mid-epoch: by default the epoch goes on where it stopped; with ignore_data_skip it starts over."""
    make_trainer(str(tmp_path / "out"), max_steps=6, stop_after=2, eval_strategy="no").train()

    def first_batch_after_resume(ignore):
        seen = []

        class FirstBatch(TrainerCallback):
            def on_step_begin(self, args, state, control, **kwargs):
                seen.append(state.global_step)

        trainer = make_trainer(str(tmp_path / "out"), max_steps=6, eval_strategy="no", save_strategy="no",
                               ignore_data_skip=ignore)
        trainer.add_callback(FirstBatch())
        return trainer.train(resume_from_checkpoint=str(tmp_path / "out" / "checkpoint-2")), trainer

    (_, default), (_, ignoring) = first_batch_after_resume(False), first_batch_after_resume(True)
    a, b = final_weights(default), final_weights(ignoring)
    assert any(not torch.equal(a[key], b[key]) for key in a)  # other batches were read


def p_eval_accumulation(tmp_path, monkeypatch):
    """Gathered rows move to host memory every eval_accumulation_steps batches (spills counted)."""
    from trainkit.trainer import evaluation

    spills = []
    original = evaluation._GatheredResults.spill
    monkeypatch.setattr(evaluation._GatheredResults, "spill", lambda self: (spills.append(1), original(self))[1])
    trainer = quick(tmp_path, per_device_eval_batch_size=2)
    trainer.predict(RegressionData(8))
    at_end = len(spills)
    quick(tmp_path / "b", eval_accumulation_steps=1, per_device_eval_batch_size=2).predict(RegressionData(8))
    assert len(spills) - at_end > at_end  # once per batch instead of once at the end


def p_on_each_node(tmp_path, monkeypatch):
    """With a second machine faked (this process: global rank 2, first on its machine): log_on_each_node,
    log_level_replica and save_on_each_node decide what this process does."""
    monkeypatch.setattr(TrainingArguments, "process_index", property(lambda self: 2))
    monkeypatch.setattr(TrainingArguments, "local_process_index", property(lambda self: 0))
    default = TrainingArguments(str(tmp_path))
    assert default.should_log and not default.should_save
    changed = TrainingArguments(str(tmp_path), log_on_each_node=False, save_on_each_node=True,
                                log_level_replica="error")
    assert not changed.should_log and changed.should_save
    assert changed.get_process_log_level() == logging.ERROR


def p_debug(tmp_path):
    trainer = quick(tmp_path, debug="underflow_overflow")
    trainer.train()
    hooks = [module._forward_hooks for module in trainer.model.modules()]
    assert any(hooks), "DebugUnderflowOverflow registers a forward hook on every module"


PROOFS: dict[str, Any] = {
    "output_dir": p_output_dir, "per_device_train_batch_size": p_train_batch, "per_device_eval_batch_size": p_eval_batch,
    "num_train_epochs": p_epochs, "max_steps": p_max_steps, "gradient_accumulation_steps": p_accumulation,
    "average_tokens_across_devices": p_average_tokens,
    "auto_find_batch_size": Elsewhere("trainer/test_argument_wiring.py::test_auto_find_batch_size_halves_until_it_fits"),
    "learning_rate": p_lr, "weight_decay": p_weight_decay, "adam_beta1": p_betas, "adam_beta2": p_betas,
    "adam_epsilon": p_betas, "max_grad_norm": p_max_grad_norm, "optim": p_optim, "optim_args": p_optim,
    "lr_scheduler_type": p_scheduler,
    "lr_scheduler_kwargs": Elsewhere("trainer/test_arguments.py::test_hf_argument_parser_parses_every_field"),
    "warmup_steps": p_warmup,
    "warmup_ratio": p_warmup_ratio,
    "optim_target_modules": Elsewhere("trainer/test_argument_fields.py::test_each_field_constructs_or_names_what_it_needs"),
    "label_smoothing_factor": Elsewhere("trainer/test_argument_wiring.py::test_label_smoothing_is_transformers_label_smoother"),
    "bf16": p_precision, "fp16": p_precision,
    "bf16_full_eval": Elsewhere("trainer/test_argument_wiring.py::test_full_eval_precision_casts_the_model_outside_training"),
    "fp16_full_eval": Elsewhere("trainer/test_argument_wiring.py::test_full_eval_precision_casts_the_model_outside_training"),
    "tf32": Elsewhere("trainer/test_argument_fields.py::test_nccl_and_tf32_on_cpu_say_what_they_need"),
    "activation_checkpointing": Elsewhere("trainer/test_argument_wiring.py::test_model_side_fields"),
    "activation_checkpointing_kwargs": Elsewhere("trainer/test_argument_wiring.py::test_model_side_fields"),
    "gradient_checkpointing": Elsewhere("trainer/test_argument_fields.py::test_activation_checkpointing_and_its_old_name_are_one_setting"),
    "gradient_checkpointing_kwargs": Warns(dict(gradient_checkpointing_kwargs={"use_reentrant": False}),
                                           "activation_checkpointing is off"),
    "torch_compile": p_compile, "torch_compile_backend": p_compile, "torch_compile_mode": p_compile,
    "use_liger_kernel": Elsewhere("trainer/test_argument_fields.py::test_each_field_constructs_or_names_what_it_needs"),
    "liger_kernel_config": Elsewhere("trainer/test_argument_fields.py::test_each_field_constructs_or_names_what_it_needs"),
    "use_cache": Elsewhere("trainer/test_argument_wiring.py::test_model_side_fields"),
    "neftune_noise_alpha": Elsewhere("trainer/test_argument_wiring.py::test_model_side_fields"),
    "torch_empty_cache_steps": Warns(dict(torch_empty_cache_steps=2, use_cpu=True), "torch_empty_cache_steps: training runs on CPU"),
    "logging_strategy": p_logging, "logging_steps": p_logging, "logging_first_step": p_logging,
    "log_on_each_node": p_on_each_node,
    "logging_nan_inf_filter": p_nan_filter, "include_num_input_tokens_seen": p_tokens_seen,
    "log_level": p_log_level, "log_level_replica": p_on_each_node,
    "logging_dir": Elsewhere("trainer/test_argument_wiring.py::test_logging_dir_of_transformers_5_1_is_where_tensorboard_writes"),
    "disable_tqdm": p_disable_tqdm, "report_to": p_report_to, "run_name": p_run_name,
    "project": Warns(dict(project="mine"), "project='mine' is read by the Trackio tracker only"),
    "trackio_space_id": Elsewhere("trainer/test_argument_fields.py::test_each_field_constructs_or_names_what_it_needs"),
    "trackio_bucket_id": Elsewhere("trainer/test_argument_fields.py::test_each_field_constructs_or_names_what_it_needs"),
    "trackio_static_space_id": Elsewhere("trainer/test_argument_fields.py::test_each_field_constructs_or_names_what_it_needs"),
    "eval_strategy": p_eval, "eval_steps": p_eval, "eval_delay": p_eval, "eval_on_start": p_eval,
    "eval_accumulation_steps": p_eval_accumulation,
    "prediction_loss_only": p_prediction_loss_only, "include_for_metrics": p_include_for_metrics,
    "eval_do_concat_batches": Elsewhere("trainer/test_argument_wiring.py::test_batch_eval_metrics_and_unconcatenated_batches"),
    "eval_use_gather_object": Elsewhere("trainer/test_argument_wiring.py::test_eval_use_gather_object_gives_one_object_per_sample"),
    "batch_eval_metrics": Elsewhere("trainer/test_argument_wiring.py::test_batch_eval_metrics_and_unconcatenated_batches"),
    "save_strategy": p_save, "save_steps": p_save, "save_total_limit": p_save,
    "save_only_model": Elsewhere("trainer/checkpointing/test_checkpoints.py::test_save_only_model_writes_weights_and_state_only_and_still_resumes"),
    "save_on_each_node": p_on_each_node,
    "async_save": Elsewhere("trainer/test_async_checkpoints.py::test_async_checkpoints_are_the_synchronous_ones_and_resume_exactly"),
    "async_save_when_busy": Elsewhere("trainer/test_async_checkpoints.py::test_async_save_when_busy_skip_skips_the_saves_that_find_a_write_in_flight"),
    "load_best_model_at_end": p_best, "metric_for_best_model": p_best, "greater_is_better": p_best,
    "resume_from_checkpoint": FOR_SCRIPTS,
    "ignore_data_skip": p_ignore_data_skip,
    "restore_callback_states_from_checkpoint": p_callback_states,
    "enable_jit_checkpoint": Elsewhere("cli/test_preemption_settings.py::test_trainer_switch_follows_saving_unless_set"),
    "seed": p_seed,
    "full_determinism": Elsewhere("trainer/test_argument_wiring.py::test_full_determinism_turns_on_deterministic_algorithms"),
    "data_seed": p_data_seed, "use_cpu": p_use_cpu,
    "local_rank": Warns(dict(local_rank=3), "local_rank=3 in TrainingArguments has no effect"),
    "accelerator_config": Elsewhere("trainer/test_argument_fields.py::test_engine_options_from_ddp_fields_and_accelerator_config"),
    "parallelism_config": Elsewhere("engine/strategies/test_nd_parallel_entry_points.py::test_launch_config_and_training_arguments_train_as_one_process"),
    "ddp_find_unused_parameters": Elsewhere("trainer/test_argument_wiring.py::test_ddp_fields_reach_ddp_and_the_process_group"),
    "ddp_bucket_cap_mb": Elsewhere("trainer/test_argument_wiring.py::test_ddp_fields_reach_ddp_and_the_process_group"),
    "ddp_broadcast_buffers": Elsewhere("trainer/test_argument_wiring.py::test_ddp_fields_reach_ddp_and_the_process_group"),
    "ddp_static_graph": Elsewhere("trainer/test_argument_wiring.py::test_ddp_fields_reach_ddp_and_the_process_group"),
    "ddp_backend": Elsewhere("trainer/test_argument_wiring.py::test_ddp_fields_reach_ddp_and_the_process_group"),
    "ddp_timeout": Elsewhere("trainer/test_argument_wiring.py::test_ddp_fields_reach_ddp_and_the_process_group"),
    "debug": p_debug,
    "skip_memory_metrics": Elsewhere("trainer/test_argument_wiring.py::test_memory_metrics_when_not_skipped"),
    "dataloader_drop_last": p_dataloader, "dataloader_num_workers": p_dataloader, "dataloader_pin_memory": p_dataloader,
    "dataloader_persistent_workers": p_dataloader, "dataloader_prefetch_factor": p_dataloader,
    "dataloader_multiprocessing_context": p_dataloader, "dataloader_in_order": p_dataloader,
    "remove_unused_columns": Elsewhere("trainer/test_trainer.py::test_datasets_columns_the_forward_does_not_take_are_dropped"),
    "label_names": p_label_names,
    "train_sampling_strategy": Elsewhere("trainer/test_argument_wiring.py::test_sequential_sampling_keeps_dataset_order"),
    "length_column_name": Elsewhere("trainer/test_argument_wiring.py::test_group_by_length_batches_similar_lengths"),
    "group_by_length": Elsewhere("trainer/test_argument_wiring.py::test_group_by_length_of_transformers_5_1_is_the_length_grouped_sampler"),
    "fsdp": Elsewhere("trainer/checkpointing/test_checkpoints_processes.py::test_fsdp_sharded_checkpoint_holds_dcp_shards_that_merge_weights_turns_into_the_model"),
    "fsdp_config": Elsewhere("trainer/checkpointing/test_checkpoints_processes.py::test_fsdp_sharded_checkpoint_holds_dcp_shards_that_merge_weights_turns_into_the_model"),
    "deepspeed": Elsewhere("engine/strategies/test_deepspeed_processes.py::test_training_arguments_deepspeed_gives_the_same_run"),
    "push_to_hub": p_hub, "hub_model_id": p_hub, "hub_strategy": p_hub, "hub_token": p_hub, "hub_private_repo": p_hub,
    "hub_revision": p_hub,
    "hub_always_push": Warns(dict(hub_always_push=True), "hub_always_push in TrainingArguments has no effect"),
    "do_train": FOR_SCRIPTS, "do_eval": FOR_SCRIPTS, "do_predict": FOR_SCRIPTS,
}


def test_every_field_has_a_proof():
    fields = {f.name for f in dataclasses.fields(TrainingArguments)}
    assert sorted(fields - set(PROOFS)) == [], "a field without a proof of its effect (or of its warning)"
    assert sorted(set(PROOFS) - fields) == []


def _proof_ids() -> list[tuple[str, Any]]:
    """One case per distinct proof (fields sharing a proof run it once)."""
    seen: dict[Any, str] = {}
    for name, proof in PROOFS.items():
        key = proof if callable(proof) or proof == FOR_SCRIPTS else (type(proof), repr(proof))
        seen.setdefault(key, name)
    return [(name, PROOFS[name]) for name in seen.values()]


@pytest.mark.parametrize("name, proof", _proof_ids(), ids=[name for name, _ in _proof_ids()])
def test_the_field_acts_or_says_why_not(name, proof, tmp_path, monkeypatch, caplog):
    if proof == FOR_SCRIPTS:
        args = TrainingArguments(str(tmp_path), **{name: "x/checkpoint-1" if name == "resume_from_checkpoint" else True})
        assert args.to_dict()[name] and name in TrainingArguments.__dataclass_fields__
    elif isinstance(proof, Warns):
        argument_checks._WARNED.clear()
        with caplog.at_level(logging.WARNING, logger="trainkit"):
            TrainingArguments(str(tmp_path), **proof.kwargs)
            TrainingArguments(str(tmp_path), **proof.kwargs)
        lines = [r.getMessage() for r in caplog.records if proof.text in r.getMessage()]
        assert len(lines) == 1 and name in lines[0], lines  # once, though the arguments were built twice
    elif isinstance(proof, Elsewhere):
        path, test = proof.test.split("::")
        assert re.search(rf"^def {re.escape(test)}\(", (TESTS / path).read_text(), re.MULTILINE), proof.test
    else:
        parameters = proof.__code__.co_varnames[:proof.__code__.co_argcount]
        proof(tmp_path, **({"monkeypatch": monkeypatch} if "monkeypatch" in parameters else {}))


def test_fields_that_change_nothing_here_say_so_once(tmp_path, caplog):
    argument_checks._WARNED.clear()
    with caplog.at_level(logging.WARNING, logger="trainkit"):
        for _ in range(2):
            TrainingArguments(str(tmp_path), save_strategy="no", save_total_limit=2, hub_model_id="me/m",
                              length_column_name="n")
    text = caplog.text
    assert text.count("save_total_limit in TrainingArguments has no effect: save_strategy='no'") == 1
    assert text.count("hub_model_id in TrainingArguments has no effect: it is read only with push_to_hub=True") == 1
    assert text.count("length_column_name='n' in TrainingArguments has no effect") == 1
    TrainingArguments(str(tmp_path), push_to_hub=True, hub_always_push=True)
    assert "hub_always_push=True in TrainingArguments has no effect: trainkit uploads synchronously" in caplog.text
    TrainingArguments(str(tmp_path), async_save_when_busy="skip")
    assert "async_save_when_busy='skip' in TrainingArguments has no effect: it is read only with async_save=True" \
        in caplog.text


@pytest.mark.parametrize("kwargs, message", [
    (dict(num_train_epochs="3"), r"num_train_epochs='3' in TrainingArguments must be a number, not str\. Pass num_train_epochs=3"),
    (dict(learning_rate="abc"), r"learning_rate='abc' in TrainingArguments must be a number, not str\.$"),
    (dict(learning_rate="1e-3"), r"Pass learning_rate=0\.001.*YAML 1\.1"),
    (dict(fp16="False"), r"fp16='False' in TrainingArguments must be True/False"),
    (dict(max_steps="5"), r"max_steps='5' .* must be an integer"),
    (dict(lr_scheduler_kwargs="cycles=2"), r"lr_scheduler_kwargs='cycles=2' .* must be a dict or a JSON object"),
    (dict(async_save=True, async_save_when_busy="later"), r"async_save_when_busy='later' in TrainingArguments is not valid; use 'wait'.*'skip'"),
])
def test_values_of_the_wrong_type_fail_at_construction_naming_the_field(tmp_path, kwargs, message):
    """transformers keeps these strings and its Trainer later stops on a bare TypeError; here they fail at once."""
    with pytest.raises(ValueError, match=message):
        TrainingArguments(str(tmp_path), **kwargs)


def test_an_output_dir_that_is_a_file_is_named_once(tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("")
    for output_dir, expected in ((afile, "is an existing file"), (afile / "sub", "is inside")):
        with pytest.raises(ValueError, match="output_dir") as caught:
            TrainingArguments(str(output_dir))
        assert expected in str(caught.value) and "afile/afile" not in str(caught.value)


def test_the_trainer_refuses_at_construction_what_would_fail_after_an_epoch(tmp_path):
    """Checked before the model is built (model_init is never called)."""
    from trainkit import Trainer

    def model_init():
        raise AssertionError("the model must not be built")

    class Stream(torch.utils.data.IterableDataset):
        def __iter__(self):
            yield from RegressionData(4)

    cases = [
        (dict(eval_strategy="epoch"), {}, "eval_strategy='epoch' evaluates during training, but the Trainer got no eval_dataset"),
        (dict(eval_on_start=True), {}, "eval_on_start=True evaluates"),
        (dict(eval_strategy="epoch", save_strategy="epoch", load_best_model_at_end=True), {},
         "with load_best_model_at_end=True"),
        (dict(eval_strategy="epoch", metric_for_best_model="accuracy"), dict(eval_dataset=RegressionData(4)),
         "metric_for_best_model='accuracy' needs a compute_metrics"),
        (dict(batch_eval_metrics=True), dict(compute_metrics=lambda prediction: {}), "takes no compute_result"),
        ({}, dict(train_dataset=Stream()), "has no length"),
    ]
    for arguments, trainer_kwargs, message in cases:
        args = TrainingArguments(str(tmp_path), report_to="none", **arguments)
        with pytest.raises(ValueError, match=re.escape(message)):
            Trainer(model_init=model_init, args=args, **trainer_kwargs)
