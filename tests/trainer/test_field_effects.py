"""Every TrainingArguments field acts, or says why it cannot (CPU; the proofs of processes on 2 gloo ranks).

``PROOFS`` holds one proof per field (kinds in tests/proofs.py; the functions in tests/trainer/field_proofs/), and a
field without one fails ``test_every_field_has_a_proof``, so a new field cannot arrive silently. A proof sets a
non-default value and observes the effect from outside the Trainer, so it fails when trainkit ignores the field:
``python -m pytest tests/ignore_each_field.py`` runs every proof with its field ignored (TRAINKIT_IGNORE_FIELD)
and expects each to fail (docs/trainer.md, "What the tests prove").
"""

from __future__ import annotations

import dataclasses
import logging
import re
from typing import Any

import pytest
import torch

from tests.proofs import OnGPU, Refuses, Warns, case, run_proof
from tests.trainer.checkpoint_workload import RegressionData
from tests.trainer.field_proofs import data_checkpoints as data, outputs, processes, training
from trainkit import TrainingArguments
from trainkit.trainer.training_arguments import checks as argument_checks

pytestmark = pytest.mark.timeout(300)

CUDA_ONLY = "on a machine without CUDA"
PROOFS: dict[str, Any] = {
    # duration and batches
    "output_dir": data.p_output_dir, "per_device_train_batch_size": training.p_train_batch,
    "per_device_eval_batch_size": training.p_eval_batch, "num_train_epochs": training.p_epochs,
    "max_steps": training.p_max_steps, "gradient_accumulation_steps": training.p_accumulation,
    "average_tokens_across_devices": processes.p_average_tokens, "auto_find_batch_size": training.p_auto_find_batch_size,
    # optimizer and schedule
    "learning_rate": training.p_lr, "weight_decay": training.p_weight_decay, "adam_beta1": training.p_adam_beta1,
    "adam_beta2": training.p_adam_beta2, "adam_epsilon": training.p_adam_epsilon,
    "max_grad_norm": training.p_max_grad_norm, "optim": training.p_optim, "optim_args": training.p_optim_args,
    "lr_scheduler_type": training.p_scheduler, "lr_scheduler_kwargs": training.p_scheduler_kwargs,
    "warmup_steps": training.p_warmup, "warmup_ratio": training.p_warmup_ratio,
    "optim_target_modules": Refuses(dict(optim_target_modules=["attn"]), "GaLore/APOLLO"),
    "label_smoothing_factor": training.p_label_smoothing,
    # precision, memory, compilation, model-side features
    "bf16": training.p_bf16, "fp16": training.p_fp16, "bf16_full_eval": training.p_bf16_full_eval,
    "fp16_full_eval": training.p_fp16_full_eval, "tf32": training.p_tf32,
    "activation_checkpointing": training.p_activation_checkpointing,
    "activation_checkpointing_kwargs": training.p_activation_checkpointing_kwargs,
    "gradient_checkpointing": training.p_gradient_checkpointing,
    "gradient_checkpointing_kwargs": training.p_gradient_checkpointing_kwargs,
    "torch_compile": training.p_torch_compile, "torch_compile_backend": training.p_torch_compile_backend,
    "torch_compile_mode": training.p_torch_compile_mode,
    "use_liger_kernel": OnGPU(training.p_liger_gpu, f"Liger kernels need a CUDA GPU and the liger-kernel package",
                              here=Refuses(dict(use_liger_kernel=True), "liger-kernel package")),
    "liger_kernel_config": OnGPU(training.p_liger_config_gpu, "Liger kernels need a CUDA GPU and the liger-kernel package",
                                 here=Refuses(dict(liger_kernel_config={"rms_norm": False}),
                                              "only acts with use_liger_kernel=True")),
    "use_cache": training.p_use_cache, "neftune_noise_alpha": training.p_neftune,
    "torch_empty_cache_steps": OnGPU(training.p_torch_empty_cache_steps_gpu, "a CPU has no device cache to empty",
                                     here=Warns(dict(torch_empty_cache_steps=2, use_cpu=True),
                                                "torch_empty_cache_steps: training runs on CPU")),
    # logging and trackers
    "logging_strategy": outputs.p_logging_strategy, "logging_steps": outputs.p_logging_steps,
    "logging_first_step": outputs.p_logging_first_step, "log_on_each_node": processes.p_log_on_each_node,
    "logging_nan_inf_filter": outputs.p_nan_filter, "include_num_input_tokens_seen": outputs.p_tokens_seen,
    "log_level": outputs.p_log_level, "log_level_replica": processes.p_log_level_replica,
    "logging_dir": outputs.p_logging_dir, "disable_tqdm": outputs.p_disable_tqdm, "report_to": outputs.p_report_to,
    "run_name": outputs.p_run_name,
    "project": Warns(dict(project="mine"), "project='mine' is read by the Trackio tracker only"),
    "trackio_space_id": Refuses(dict(trackio_space_id="me/space"), "needs the Trackio tracker"),
    "trackio_bucket_id": Refuses(dict(trackio_bucket_id="me/bucket"), "needs the Trackio tracker"),
    "trackio_static_space_id": Refuses(dict(trackio_static_space_id="me/static"), "needs the Trackio tracker"),
    # evaluation
    "eval_strategy": outputs.p_eval_strategy, "eval_steps": outputs.p_eval_steps, "eval_delay": outputs.p_eval_delay,
    "eval_on_start": outputs.p_eval_on_start, "eval_accumulation_steps": outputs.p_eval_accumulation,
    "prediction_loss_only": outputs.p_prediction_loss_only, "include_for_metrics": outputs.p_include_for_metrics,
    "eval_do_concat_batches": outputs.p_eval_do_concat_batches,
    "eval_use_gather_object": outputs.p_eval_use_gather_object, "batch_eval_metrics": outputs.p_batch_eval_metrics,
    # checkpoints and the best model
    "save_strategy": data.p_save_strategy, "save_steps": data.p_save_steps, "save_total_limit": data.p_save_total_limit,
    "save_only_model": data.p_save_only_model, "save_on_each_node": processes.p_save_on_each_node,
    "async_save": data.p_async_save, "async_save_when_busy": data.p_async_save_when_busy,
    "checkpoint_dir": data.p_checkpoint_dir,
    "load_best_model_at_end": data.p_load_best_model_at_end, "metric_for_best_model": data.p_metric_for_best_model,
    "greater_is_better": data.p_greater_is_better, "resume_from_checkpoint": outputs.p_resume_from_checkpoint,
    "ignore_data_skip": data.p_ignore_data_skip, "restore_callback_states_from_checkpoint": data.p_callback_states,
    "enable_jit_checkpoint": data.p_enable_jit_checkpoint,
    # reproducibility and hardware
    "seed": training.p_seed, "full_determinism": training.p_full_determinism, "data_seed": training.p_data_seed,
    "use_cpu": OnGPU(data.p_use_cpu, "CPU is the only device " + CUDA_ONLY),
    "local_rank": Warns(dict(local_rank=3), "local_rank=3 in TrainingArguments has no effect"),
    "accelerator_config": processes.p_accelerator_config, "parallelism_config": processes.p_parallelism_config,
    "ddp_find_unused_parameters": processes.p_ddp_find_unused_parameters,
    "ddp_bucket_cap_mb": processes.p_ddp_bucket_cap_mb, "ddp_broadcast_buffers": processes.p_ddp_broadcast_buffers,
    "ddp_static_graph": processes.p_ddp_static_graph, "ddp_timeout": processes.p_ddp_timeout,
    "ddp_backend": OnGPU(processes.p_ddp_backend_gpu, "gloo is the only backend " + CUDA_ONLY,
                         here=Refuses(dict(ddp_backend="nccl"), "needs NVIDIA GPUs")),
    "debug": outputs.p_debug, "skip_memory_metrics": outputs.p_skip_memory_metrics,
    # data loading
    "dataloader_drop_last": data.p_dataloader_drop_last, "dataloader_num_workers": data.p_dataloader_num_workers,
    "dataloader_pin_memory": OnGPU(data.p_dataloader_pin_memory, "torch pins memory only for a CUDA device"),
    "dataloader_persistent_workers": data.p_dataloader_persistent_workers,
    "dataloader_prefetch_factor": data.p_dataloader_prefetch_factor,
    "dataloader_multiprocessing_context": data.p_dataloader_multiprocessing_context,
    "dataloader_in_order": data.p_dataloader_in_order, "remove_unused_columns": data.p_remove_unused_columns,
    "label_names": outputs.p_label_names, "train_sampling_strategy": data.p_train_sampling_strategy,
    "group_by_length": data.p_group_by_length, "length_column_name": data.p_length_column_name,
    # sharding
    "fsdp": processes.p_fsdp, "fsdp_config": processes.p_fsdp_config, "deepspeed": training.p_deepspeed,
    # the Hub (a recording stand-in for huggingface_hub.HfApi: no network)
    "push_to_hub": outputs.p_push_to_hub, "hub_model_id": outputs.p_hub_model_id, "hub_strategy": outputs.p_hub_strategy,
    "hub_token": outputs.p_hub_token, "hub_private_repo": outputs.p_hub_private_repo,
    "hub_revision": outputs.p_hub_revision,
    "hub_always_push": Warns(dict(push_to_hub=True, hub_always_push=True), "hub_always_push=True in TrainingArguments"),
    # read by scripts (run_glue.py's `if training_args.do_train`), not by any Trainer: transformers is the oracle
    "do_train": outputs.p_do_train, "do_eval": outputs.p_do_eval, "do_predict": outputs.p_do_predict,
}
IN_PROCESSES = {name for name, proof in PROOFS.items() if getattr(proof, "__module__", "") == processes.__name__}


def build_arguments(**kwargs) -> TrainingArguments:
    return TrainingArguments("proofs_out", **kwargs)


def field_cases() -> list:
    return [case(name, proof, *([pytest.mark.multiprocess] if name in IN_PROCESSES else []))
            for name, proof in PROOFS.items()]


def test_every_field_has_a_proof():
    fields = {f.name for f in dataclasses.fields(TrainingArguments)}
    assert sorted(fields - set(PROOFS)) == [], "a field without a proof of its effect (or of why it cannot act)"
    assert sorted(set(PROOFS) - fields) == []


@pytest.mark.parametrize("name, proof", field_cases())
def test_the_field_acts_or_says_why_not(name, proof, request, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)  # a proof whose field is ignored writes to the default output_dir: here
    run_proof(proof, request, build_arguments, argument_checks._WARNED.clear)


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
