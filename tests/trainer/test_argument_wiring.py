"""The transformers 5.23 fields act in the Trainer (CPU, one process; the DDP fields in one 2-process gloo launch)."""

import json
import os
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.data import Dataset

from tests.distributed import run_torchrun
from tests.trainer.helpers import EchoModel, IndexDataset, TinyTokenModel, TokenDataset
from trainkit import Trainer, TrainingArguments

WORKER = Path(__file__).with_name("fields_worker.py")


def _args(tmp_path, **extra):
    settings = dict(output_dir=str(tmp_path), use_cpu=True, report_to="none", disable_tqdm=True, save_strategy="no",
                    per_device_train_batch_size=4, max_steps=2, logging_steps=1, learning_rate=0.1)
    settings.update(extra)
    return TrainingArguments(**settings)


def _tiny_gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(vocab_size=32, n_positions=16, n_embd=16, n_layer=2, n_head=2, bos_token_id=0, eos_token_id=0,
                                      resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0))


class CausalTokens(Dataset):
    def __init__(self, size=8, length=10):
        self.ids = torch.randint(32, (size, length), generator=torch.Generator().manual_seed(3))

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def test_label_smoothing_is_transformers_label_smoother(tmp_path):
    from transformers.trainer_pt_utils import LabelSmoother

    model, batch = _tiny_gpt2(), CausalTokens()[0]
    inputs = {k: v[None] for k, v in batch.items()}
    trainer = Trainer(model=model, args=_args(tmp_path, label_smoothing_factor=0.2), train_dataset=CausalTokens())
    smoothed = trainer.compute_loss(model, inputs)
    with torch.no_grad():
        logits = model(input_ids=inputs["input_ids"]).logits
    expected = LabelSmoother(epsilon=0.2)({"logits": logits}, inputs["labels"], shift_labels=True)  # GPT-2 is causal: shifted
    plain = model(**inputs).loss
    torch.testing.assert_close(smoothed, expected)
    assert not torch.allclose(smoothed, plain)


def test_label_smoothing_for_a_token_classifier_does_not_shift(tmp_path):
    from transformers.trainer_pt_utils import LabelSmoother

    model = TinyTokenModel()
    inputs = {k: torch.stack([TokenDataset()[i][k] for i in range(4)]) for k in ("input_ids", "labels")}
    trainer = Trainer(model=model, args=_args(tmp_path, label_smoothing_factor=0.1), train_dataset=TokenDataset())
    expected = LabelSmoother(epsilon=0.1)(model(inputs["input_ids"]), inputs["labels"])
    torch.testing.assert_close(trainer.compute_loss(model, inputs), expected)


class VariableLengths(Dataset):
    """Samples of lengths 1..64 in random order."""

    def __init__(self):
        self.lengths = torch.randperm(64, generator=torch.Generator().manual_seed(0)) + 1

    def __len__(self):
        return 64

    def __getitem__(self, i):
        return {"input_ids": torch.ones(int(self.lengths[i]), dtype=torch.long)}


def _length_spread(trainer) -> int:
    from transformers import DataCollatorWithPadding  # noqa: F401 - documents what the collator mimics

    spreads = []
    for batch in trainer.get_train_dataloader():
        lengths = batch["attention_mask"].sum(1)
        spreads.append(int(lengths.max() - lengths.min()))
    return sum(spreads)


def _pad_collator(features):
    longest = max(len(f["input_ids"]) for f in features)
    ids = torch.zeros(len(features), longest, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, feature in enumerate(features):
        ids[row, : len(feature["input_ids"])] = feature["input_ids"]
        mask[row, : len(feature["input_ids"])] = 1
    return {"input_ids": ids, "attention_mask": mask}


def test_group_by_length_batches_similar_lengths(tmp_path):
    def trainer(strategy):
        args = _args(tmp_path, train_sampling_strategy=strategy, remove_unused_columns=False)
        return Trainer(model=EchoModel(), args=args, train_dataset=VariableLengths(), data_collator=_pad_collator)

    grouped, shuffled = _length_spread(trainer("group_by_length")), _length_spread(trainer("random"))
    # transformers' grouping sorts megabatches of 4 batches by length: far tighter batches than a shuffle.
    assert 2 * grouped < shuffled, (grouped, shuffled)
    first = next(iter(trainer("group_by_length").get_train_dataloader()))
    assert first["attention_mask"].sum(1).max() == 64  # transformers' order: the longest batch comes first


def test_group_by_length_of_transformers_5_1_is_the_length_grouped_sampler(tmp_path):
    """CPU: group_by_length=True (5.1's spelling) gives the batches of train_sampling_strategy='group_by_length'."""
    def batches(**spelling):
        args = _args(tmp_path, remove_unused_columns=False, **spelling)
        trainer = Trainer(model=EchoModel(), args=args, train_dataset=VariableLengths(), data_collator=_pad_collator)
        return [batch["attention_mask"].sum(1).tolist() for batch in trainer.get_train_dataloader()]

    assert batches(group_by_length=True) == batches(train_sampling_strategy="group_by_length")
    assert batches(group_by_length=True) != batches()


def test_logging_dir_of_transformers_5_1_is_where_tensorboard_writes(tmp_path):
    """CPU: logging_dir (5.1's name) is the folder of the TensorBoard event files; the JSONL log stays in output_dir."""
    pytest.importorskip("tensorboard", reason="report_to='tensorboard' needs the optional tensorboard package")
    args = _args(tmp_path / "out", report_to=["tensorboard", "jsonl"], logging_dir=str(tmp_path / "tb"))
    Trainer(model=EchoModel(), args=args, train_dataset=IndexDataset(8)).train()
    assert any(name.startswith("events.out.tfevents") for name in os.listdir(tmp_path / "tb"))
    assert (tmp_path / "out" / "logs" / "metrics.jsonl").exists()


def test_tensorboard_folder_comes_from_the_environment_variable_transformers_reads(tmp_path, monkeypatch):
    """CPU: TENSORBOARD_LOGGING_DIR (transformers 5.x's TensorBoard callback) is the folder of the event files;
    logging_dir, where set, comes first."""
    pytest.importorskip("tensorboard", reason="report_to='tensorboard' needs the optional tensorboard package")
    monkeypatch.setenv("TENSORBOARD_LOGGING_DIR", str(tmp_path / "from-env"))
    Trainer(model=EchoModel(), args=_args(tmp_path / "a", report_to="tensorboard"), train_dataset=IndexDataset(8)).train()
    assert any(name.startswith("events.out.tfevents") for name in os.listdir(tmp_path / "from-env"))
    args = _args(tmp_path / "b", report_to="tensorboard", logging_dir=str(tmp_path / "field"))
    Trainer(model=EchoModel(), args=args, train_dataset=IndexDataset(8)).train()
    assert any(name.startswith("events.out.tfevents") for name in os.listdir(tmp_path / "field"))
    assert len(os.listdir(tmp_path / "from-env")) == 1


def test_sequential_sampling_keeps_dataset_order(tmp_path):
    args = _args(tmp_path, train_sampling_strategy="sequential", per_device_train_batch_size=5)
    batch = next(iter(Trainer(model=EchoModel(), args=args, train_dataset=IndexDataset(13)).get_train_dataloader()))
    assert batch["x"].squeeze(-1).tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]


def test_model_side_fields(tmp_path):
    """CPU: activation checkpointing and use_cache reach the model; NEFTune noise is on during train() only (its
    hook is removed when training ends, as transformers does)."""
    from trainkit import TrainerCallback

    ids = torch.arange(8)[None]

    class NoiseProbe(TrainerCallback):
        noisy_in_training = None

        def on_step_end(self, args, state, control, model=None, **kwargs):
            embeddings = model.get_input_embeddings()  # the model is in training mode here
            self.noisy_in_training = not torch.equal(embeddings(ids), embeddings(ids))

    model = _tiny_gpt2()
    model.config.use_cache = True
    args = _args(tmp_path, activation_checkpointing=True, neftune_noise_alpha=5.0, use_cache=False)
    probe = NoiseProbe()
    trainer = Trainer(model=model, args=args, train_dataset=CausalTokens(), callbacks=[probe])
    trainer.train()
    assert _checkpointing_is_on(model) and model.config.use_cache is False
    assert probe.noisy_in_training is True
    embeddings = model.get_input_embeddings()
    model.train()
    from trainkit.trainer.neftune import noise_hook

    assert noise_hook() not in embeddings._forward_hooks.values()
    assert torch.equal(embeddings(ids), embeddings(ids))


def test_neftune_takes_the_installed_transformers_hook_and_finds_a_peft_models_embeddings():
    """CPU: the hook is the installed release's (transformers.integrations.neftune, or trainer_utils in 5.1); a PEFT
    model's noise goes on its base model's embeddings; a model without input embeddings is named."""
    import transformers

    from trainkit.trainer.neftune import activate_neftune, noise_hook

    hook = noise_hook()
    assert hook.__module__.startswith("transformers.") and hook.__name__ == "neftune_post_forward_hook"
    assert hook is (getattr(getattr(transformers, "integrations", None), "neftune", None) or transformers.trainer_utils
                    ).neftune_post_forward_hook
    with pytest.raises(ValueError, match="get_input_embeddings"):
        activate_neftune(nn.Linear(2, 2), 5.0)
    peft = pytest.importorskip("peft", reason="the PEFT case needs the optional peft package")
    model = _tiny_gpt2()
    wrapped = peft.get_peft_model(model, peft.LoraConfig(target_modules=["c_attn"]))
    handle = activate_neftune(wrapped, 5.0)
    embeddings, ids = model.get_input_embeddings(), torch.arange(8)[None]
    wrapped.train()
    assert embeddings.neftune_noise_alpha == 5.0 and not torch.equal(embeddings(ids), embeddings(ids))
    handle.remove()
    assert torch.equal(embeddings(ids), embeddings(ids))


def _checkpointing_is_on(model) -> bool:
    """Read through the property the installed transformers has (is_activation_checkpointing from 5.23)."""
    if hasattr(type(model), "is_activation_checkpointing"):
        return model.is_activation_checkpointing
    return model.is_gradient_checkpointing


def test_activation_checkpointing_calls_only_what_the_installed_transformers_has(tmp_path):
    """CPU: per-layer options reach the model's method where it takes them; the gradients are those without
    checkpointing (recomputation changes memory, not results)."""
    from trainkit.trainer.training_arguments.fields import model_checkpointing_options
    from trainkit.trainer.model_features import prepare_model_features

    options = {"every_n_layers": 2} if "every_n_layers" in model_checkpointing_options() else {}
    inputs = CausalTokens()[0]
    inputs = {k: v[None] for k, v in inputs.items()}
    plain, checkpointed = _tiny_gpt2(), _tiny_gpt2()
    args = _args(tmp_path, activation_checkpointing=True, activation_checkpointing_kwargs=options or None)
    prepare_model_features(Trainer(model=checkpointed, args=args, train_dataset=CausalTokens()), checkpointed)
    assert _checkpointing_is_on(checkpointed) and not _checkpointing_is_on(plain)
    for model in (plain, checkpointed):
        model.train()
        model(**inputs).loss.backward()
    for (name, a), (_, b) in zip(plain.named_parameters(), checkpointed.named_parameters()):
        torch.testing.assert_close(a.grad, b.grad, rtol=0, atol=0, msg=name)


class OlderCheckpointingModel(EchoModel):
    """A custom model with the pre-5.16 method: no every_n_layers / offload."""

    def gradient_checkpointing_enable(self, gradient_checkpointing_kwargs=None):
        self.checkpointing_kwargs = gradient_checkpointing_kwargs


def test_activation_checkpointing_falls_back_to_the_method_a_custom_model_has(tmp_path):
    """CPU: a model with only gradient_checkpointing_enable() gets the torch.utils.checkpoint keywords; options its
    method does not take are refused by name instead of reaching torch.utils.checkpoint."""
    from trainkit.trainer.training_arguments.fields import model_checkpointing_options
    from trainkit.trainer.model_features import prepare_model_features

    model = OlderCheckpointingModel()
    args = _args(tmp_path, activation_checkpointing=True, activation_checkpointing_kwargs={"use_reentrant": False})
    prepare_model_features(Trainer(model=model, args=args), model)
    assert model.checkpointing_kwargs == {"use_reentrant": False}
    if "every_n_layers" not in model_checkpointing_options():
        return  # refused at construction already (test_argument_fields)
    args = _args(tmp_path, activation_checkpointing=True, activation_checkpointing_kwargs={"every_n_layers": 2})
    with pytest.raises(ValueError, match=r"\['every_n_layers'\].*OlderCheckpointingModel"):
        prepare_model_features(Trainer(model=model, args=args), model)


class OutOfMemoryAbove(nn.Module):
    """EchoModel that raises torch's out-of-memory error for batches larger than ``limit``."""

    def __init__(self, limit):
        super().__init__()
        self.inner, self.limit, self.seen = EchoModel(), limit, []

    def forward(self, x, labels=None):
        self.seen.append(len(x))
        if len(x) > self.limit:
            raise torch.OutOfMemoryError("CUDA out of memory (simulated for the test)")
        return self.inner(x, labels)


def test_auto_find_batch_size_shrinks_until_it_fits(tmp_path):
    """CPU: each out-of-memory error restarts training with 90% of the batch size (rounded down, as transformers'
    auto_find_batch_size through accelerate's find_executable_batch_size); the arguments stay as written, the
    size found is the Trainer's and the state's, and a resume with auto_find_batch_size starts from it."""
    model = OutOfMemoryAbove(limit=3)
    args = _args(tmp_path, auto_find_batch_size=True, per_device_train_batch_size=5, max_steps=-1, num_train_epochs=1,
                 save_strategy="epoch")
    trainer = Trainer(model=model, args=args, train_dataset=IndexDataset(12))
    output = trainer.train()
    assert model.seen[:3] == [5, 4, 3] and set(model.seen[2:]) == {3}
    assert args.per_device_train_batch_size == 5 and trainer._train_batch_size == trainer.state.train_batch_size == 3
    assert output.global_step == 4  # the plan follows the batch size that fits: 12 samples / 3
    resumed = Trainer(model=OutOfMemoryAbove(limit=3), args=args, train_dataset=IndexDataset(12))
    assert resumed._train_batch_size == 5
    resumed.train(resume_from_checkpoint=True)
    assert resumed._train_batch_size == 3 and resumed.model.seen == []  # nothing left to train, nothing re-tried


def test_batch_eval_metrics_and_unconcatenated_batches(tmp_path):
    calls = []

    def metrics(prediction, compute_result):
        calls.append((len(prediction.predictions), compute_result))
        return {"batches": len(calls)} if compute_result else {}

    args = _args(tmp_path, batch_eval_metrics=True, per_device_eval_batch_size=5)
    result = Trainer(model=EchoModel(), args=args, eval_dataset=IndexDataset(13), compute_metrics=metrics).evaluate()
    assert calls == [(5, False), (5, False), (3, True)] and result["eval_batches"] == 3

    args = _args(tmp_path, eval_do_concat_batches=False, per_device_eval_batch_size=5)
    output = Trainer(model=EchoModel(), args=args).predict(IndexDataset(13))
    assert [len(batch) for batch in output.predictions] == [5, 5, 3]
    assert output.metrics["test_loss"] == pytest.approx(0.0)


def test_eval_use_gather_object_gives_one_object_per_sample(tmp_path):
    args = _args(tmp_path, eval_use_gather_object=True, per_device_eval_batch_size=5)
    output = Trainer(model=EchoModel(), args=args).predict(IndexDataset(13))
    assert [float(p) for p in output.predictions] == [float(i) for i in range(13)]
    assert output.metrics["test_loss"] == pytest.approx(0.0)


def test_full_eval_precision_casts_the_model_outside_training(tmp_path):
    model = EchoModel()
    trainer = Trainer(model=model, args=_args(tmp_path, bf16_full_eval=True), eval_dataset=IndexDataset(4))
    trainer.evaluate()
    assert model.offset.dtype == torch.bfloat16


def test_full_determinism_turns_on_deterministic_algorithms(tmp_path):
    before = torch.are_deterministic_algorithms_enabled()
    try:
        Trainer(model=EchoModel(), args=_args(tmp_path, full_determinism=True))
        assert torch.are_deterministic_algorithms_enabled()
    finally:
        torch.use_deterministic_algorithms(before)
        os.environ.pop("CUBLAS_WORKSPACE_CONFIG", None)


def test_trainer_methods_scripts_call(tmp_path):
    from transformers.trainer_utils import get_last_checkpoint

    model = _tiny_gpt2()
    args = _args(tmp_path, save_strategy="steps", save_steps=1, max_steps=2)
    trainer = Trainer(model=model, args=args, train_dataset=CausalTokens())
    metrics = trainer.train().metrics
    assert get_last_checkpoint(str(tmp_path)) == str(tmp_path / "checkpoint-2")
    trainer.log_metrics("train", metrics)
    trainer.save_metrics("train", metrics)
    trainer.save_state()
    trainer.save_model()
    trainer.create_model_card(model_name="tiny", tasks="text-generation")
    assert json.loads((tmp_path / "train_results.json").read_text())["train_loss"] == metrics["train_loss"]
    assert (tmp_path / "trainer_state.json").exists() and (tmp_path / "model.safetensors").exists()
    assert "tiny" in (tmp_path / "README.md").read_text()
    assert trainer.is_world_process_zero() and trainer.is_local_process_zero()
    # Resume from the latest (True) and from a path: both continue at the saved step.
    again = Trainer(model=_tiny_gpt2(), args=_args(tmp_path, save_strategy="no", max_steps=3), train_dataset=CausalTokens())
    assert again.train(resume_from_checkpoint=True).global_step == 3
    again = Trainer(model=_tiny_gpt2(), args=_args(tmp_path, save_strategy="no", max_steps=3), train_dataset=CausalTokens())
    assert again.train(resume_from_checkpoint=str(tmp_path / "checkpoint-1")).global_step == 3


@pytest.mark.multiprocess
@pytest.mark.timeout(300)
def test_ddp_fields_reach_ddp_and_the_process_group(tmp_path):
    """CPU/gloo, 2 processes, one launch: ddp_* fields, ddp_timeout, attributes, find_unused_parameters in use."""
    run_torchrun(WORKER, str(tmp_path), nproc=2, timeout=280)
    seen = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    for rank, facts in enumerate(seen):
        assert facts["ddp"] == {"find_unused_parameters": True, "bucket_bytes_cap": 5 * 1024 * 1024,
                                "broadcast_buffers": False}
        assert facts["timeout_s"] == 123 and facts["backend"] == "gloo"
        assert facts["process_index"] == rank and facts["world_size"] == 2 and facts["parallel_mode"] == "distributed"
        assert facts["should_log"] == facts["should_save"] == (rank == 0)
        assert facts["global_step"] == 3  # an unused parameter every step: trains only with find_unused_parameters
    assert seen[0]["weights"] == seen[1]["weights"]
    offset = seen[0]["weights"][0]
    assert seen[0]["gathered_objects"] == pytest.approx([i + offset for i in range(13)])  # eval_use_gather_object



def test_the_model_card_names_the_runs_accumulation_also_when_the_launcher_set_it(tmp_path, monkeypatch):
    """CPU, one process, as `trainkit launch --gradient_accumulation_steps 2` starts it: transformers' card code
    reads the accumulation from the arguments, which stay as the script wrote them (1); the card still
    describes the run (2, and the total batch it makes)."""
    from trainkit.config import LAUNCH_CONFIG_ENV, LaunchConfig, write_launch_handoff

    launch = LaunchConfig.resolve([({"gradient_accumulation_steps": 2}, "flag")])
    monkeypatch.setenv(LAUNCH_CONFIG_ENV, str(write_launch_handoff(launch, tmp_path / "launch.json")))
    trainer = Trainer(model=_tiny_gpt2(), args=_args(tmp_path / "out", max_steps=1), train_dataset=CausalTokens())
    trainer.train()
    trainer.create_model_card(model_name="tiny")
    card = (tmp_path / "out" / "README.md").read_text()
    assert "- gradient_accumulation_steps: 2" in card and "- total_train_batch_size: 8" in card
    assert trainer.args.gradient_accumulation_steps == 1

def test_memory_metrics_when_not_skipped(tmp_path):
    args = _args(tmp_path, skip_memory_metrics=False)
    trainer = Trainer(model=EchoModel(), args=args, train_dataset=IndexDataset(8), eval_dataset=IndexDataset(4))
    assert "train_mem_cpu_alloc_delta" in trainer.train().metrics
    assert "eval_mem_cpu_alloc_delta" in trainer.evaluate()
