"""Proofs of the fields that decide how training runs: batches and duration, optimizer and schedule, precision,
model-side features, compilation and seeding (CPU, one process)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tests.trainer.checkpoint_workload import DropoutRegressor
from tests.trainer.helpers import TinyTokenModel, TokenDataset
from trainkit import Trainer, TrainingArguments

from .common import logged, optimizer_steps, quick, record_forwards, training_samples


# --- batches and duration -----------------------------------------------------------------------------
def p_train_batch(tmp_path):
    trainer = quick(tmp_path, per_device_train_batch_size=4, max_steps=1)
    seen = record_forwards(trainer)
    trainer.train()
    assert [f.batch for f in seen if f.training] == [4, 4, 4]  # one window of 3 micro-batches (default 8 each)


def p_eval_batch(tmp_path):
    trainer = quick(tmp_path, per_device_eval_batch_size=3)  # the workload's own is 4, the default 8
    seen = record_forwards(trainer)
    trainer.evaluate()
    assert [f.batch for f in seen] == [3, 3, 2]  # the 8 evaluation samples


def p_epochs(tmp_path):
    trainer = quick(tmp_path, max_steps=-1, num_train_epochs=1)
    seen = record_forwards(trainer)
    trainer.train()
    assert training_samples(seen) == 44  # every sample once (the default, 3 epochs: 132)


def p_max_steps(tmp_path):
    trainer = quick(tmp_path, max_steps=3)
    seen = record_forwards(trainer)
    with optimizer_steps() as steps:
        trainer.train()
    assert len(steps) == 3 and training_samples(seen) == 3 * 3 * 2  # the workload's 2 epochs would be 16 steps


def p_accumulation(tmp_path):
    trainer = quick(tmp_path, max_steps=-1, num_train_epochs=1, gradient_accumulation_steps=2)
    seen = record_forwards(trainer)
    with optimizer_steps() as steps:
        trainer.train()
    assert len(steps) == 11 and len([f for f in seen if f.training]) == 22  # 2 micro-batches per step (default 1)


class OutOfMemoryAbove(DropoutRegressor):
    """Raises torch's out-of-memory error for batches larger than 2 (as a GPU would)."""

    def __init__(self):
        super().__init__()
        self.seen: list[int] = []

    def forward(self, x, labels=None):
        self.seen.append(len(x))
        if len(x) > 2:
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        return super().forward(x, labels)


def p_auto_find_batch_size(tmp_path):
    model = OutOfMemoryAbove()
    trainer = quick(tmp_path, model_init=lambda: model, auto_find_batch_size=True, per_device_train_batch_size=8,
                    max_steps=2, gradient_accumulation_steps=1)
    trainer.train()  # without the field, the first batch stops the run with the out-of-memory error
    # 90% of the size (rounded down) until it fits, as transformers' find_executable_batch_size, then trained
    assert model.seen[:7] == [8, 7, 6, 5, 4, 3, 2] and set(model.seen[6:]) == {2}


# --- optimizer and schedule: what torch's optimizer received, the rates each step used -----------------
def optimizer_group(trainer) -> dict:
    trainer.create_optimizer()
    return trainer.optimizer.param_groups[0]  # torch's own record of the hyper-parameters it was given


def p_lr(tmp_path):
    assert optimizer_group(quick(tmp_path, learning_rate=0.125))["lr"] == 0.125


def p_weight_decay(tmp_path):
    assert optimizer_group(quick(tmp_path, weight_decay=0.25))["weight_decay"] == 0.25


def p_adam_beta1(tmp_path):
    assert optimizer_group(quick(tmp_path, adam_beta1=0.5))["betas"][0] == 0.5


def p_adam_beta2(tmp_path):
    assert optimizer_group(quick(tmp_path, adam_beta2=0.75))["betas"][1] == 0.75


def p_adam_epsilon(tmp_path):
    assert optimizer_group(quick(tmp_path, adam_epsilon=0.125))["eps"] == 0.125


def p_max_grad_norm(tmp_path):
    """The gradient torch's optimizer steps with has at most the norm set (the workload's gradients: ~1-6)."""
    with optimizer_steps() as norms:
        quick(tmp_path, max_grad_norm=0.01, max_steps=3).train()
    assert len(norms) == 3 and max(norms) <= 0.01 * (1 + 1e-5), norms  # tolerance 1e-7: ~1e-5 of the effect


def p_optim(tmp_path):
    trainer = quick(tmp_path, optim="sgd")
    trainer.create_optimizer()
    assert type(trainer.optimizer) is torch.optim.SGD  # the default: AdamW (fused)


def p_optim_args(tmp_path):
    assert optimizer_group(quick(tmp_path, optim="sgd", optim_args="momentum=0.5,dampening=0.25"))["dampening"] == 0.25


def step_rates(trainer) -> list[float]:
    """The learning rate each optimizer step used, as logged every step."""
    trainer.train()
    return logged(trainer, "learning_rate")[: trainer.state.global_step]


def p_scheduler(tmp_path):
    trainer = quick(tmp_path, max_steps=4, lr_scheduler_type="constant", warmup_steps=0, logging_steps=1)
    assert step_rates(trainer) == [0.05] * 4  # the workload's rate, held (linear: 0.05, 0.0375, 0.025, 0.0125)


def p_scheduler_kwargs(tmp_path):
    """transformers' get_scheduler, given the same kwargs, is the oracle of the rates."""
    from transformers import get_scheduler

    kwargs = {"power": 3.0, "lr_end": 0.01}
    trainer = quick(tmp_path, max_steps=4, lr_scheduler_type="polynomial", lr_scheduler_kwargs=kwargs, warmup_steps=0)
    rates = step_rates(trainer)
    optimizer = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=0.05)
    schedule = get_scheduler("polynomial", optimizer, num_warmup_steps=0, num_training_steps=4,
                             scheduler_specific_kwargs=kwargs)
    expected = []
    for _ in range(4):
        expected.append(schedule.get_last_lr()[0])
        optimizer.step()
        schedule.step()
    # power=3 vs the default 1 moves step 2's rate by 0.0068; 1e-12 is float noise
    assert rates == pytest.approx(expected, abs=1e-12) and rates[1] == pytest.approx(0.0269, abs=1e-4)


def p_warmup(tmp_path):
    rates = step_rates(quick(tmp_path, max_steps=4, warmup_steps=2, logging_steps=1))
    assert rates[:3] == pytest.approx([0.0, 0.025, 0.05], abs=1e-12)  # the workload's 3 warm-up steps: 0, 1/60, 1/30


def p_warmup_ratio(tmp_path):
    rates = step_rates(quick(tmp_path, max_steps=4, warmup_steps=0, warmup_ratio=0.5, logging_steps=1))
    assert rates[:3] == pytest.approx([0.0, 0.025, 0.05], abs=1e-12)  # without warm-up: 0.05, 0.0375, 0.025


# --- precision: the dtype the model computed in -----------------------------------------------------------
def p_bf16(tmp_path):
    trainer = quick(tmp_path, bf16=True)
    seen = record_forwards(trainer)
    trainer.train()
    assert {(f.output_dtype, f.weight_dtype) for f in seen if f.training} == {(torch.bfloat16, torch.float32)}


def p_fp16(tmp_path):
    trainer = quick(tmp_path, fp16=True, use_cpu=True)
    seen = record_forwards(trainer)
    trainer.train()
    assert {(f.output_dtype, f.weight_dtype) for f in seen if f.training} == {(torch.float16, torch.float32)}


def full_eval_dtypes(tmp_path, **precision) -> set[torch.dtype]:
    """evaluate() outside training: the dtype of the token model's weights as its head saw them (integer inputs,
    so a half-precision model runs on CPU as on a GPU)."""
    model = TinyTokenModel()
    seen: set[torch.dtype] = set()
    model.head.register_forward_hook(lambda module, inputs, output: seen.add(module.weight.dtype))
    args = TrainingArguments(str(tmp_path), report_to="none", disable_tqdm=True, **precision)
    Trainer(model=model, args=args, eval_dataset=TokenDataset(4)).evaluate()
    return seen


def p_bf16_full_eval(tmp_path):
    assert full_eval_dtypes(tmp_path, bf16_full_eval=True) == {torch.bfloat16}


def p_fp16_full_eval(tmp_path):
    assert full_eval_dtypes(tmp_path, fp16_full_eval=True) == {torch.float16}


def p_tf32(tmp_path):
    """TF32 needs an Ampere or newer NVIDIA GPU: refused elsewhere, naming it; there, torch's matmuls use it."""
    from trainkit.config.errors import ConfigError

    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 8:
        with pytest.raises(ConfigError, match="Ampere or newer"):
            TrainingArguments(str(tmp_path), tf32=True)
        return
    before = torch.backends.cuda.matmul.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = False
        TrainingArguments(str(tmp_path), tf32=True)
        assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before


def tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=16))


def liger_norm_class(tmp_path, **fields) -> str:
    """GPU: one step of a tiny Llama with Liger; the class of its final norm (Liger swaps in LigerRMSNorm)."""
    pytest.importorskip("liger_kernel", reason="use_liger_kernel needs the optional liger-kernel package")
    model = tiny_llama()
    args = TrainingArguments(str(tmp_path), max_steps=1, per_device_train_batch_size=2, save_strategy="no",
                             report_to="none", disable_tqdm=True, use_liger_kernel=True, **fields)
    Trainer(model=model, args=args, train_dataset=CausalTokens()).train()
    return type(model.model.norm).__name__


def p_liger_gpu(tmp_path):
    assert liger_norm_class(tmp_path).startswith("Liger")


def p_liger_config_gpu(tmp_path):
    assert liger_norm_class(tmp_path, liger_kernel_config={"rms_norm": False}) == "LlamaRMSNorm"


def p_torch_empty_cache_steps_gpu(tmp_path, monkeypatch):
    """GPU: the device cache is emptied every N optimizer steps (calls counted beyond a run without the field)."""
    from .common import calls_of

    calls = calls_of(monkeypatch, torch.cuda, "empty_cache")
    if hasattr(torch, "accelerator") and hasattr(torch.accelerator, "empty_cache"):
        calls = calls_of(monkeypatch, torch.accelerator, "empty_cache")
    quick(tmp_path / "default", max_steps=2).train()
    before = len(calls)
    quick(tmp_path / "every_step", max_steps=2, torch_empty_cache_steps=1).train()
    assert len(calls) - before == 2


# --- model-side features, on a tiny GPT-2 built from a config -----------------------------------------------
def tiny_gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(vocab_size=32, n_positions=16, n_embd=16, n_layer=2, n_head=2, bos_token_id=0,
                                      eos_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0))


class CausalTokens(torch.utils.data.Dataset):
    def __init__(self, size: int = 4, length: int = 10):
        self.ids = torch.randint(32, (size, length), generator=torch.Generator().manual_seed(3))

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def gpt2_trainer(tmp_path, model, **fields) -> Trainer:
    args = TrainingArguments(str(tmp_path / "gpt2"), max_steps=1, per_device_train_batch_size=2, save_strategy="no",
                             report_to="none", disable_tqdm=True, use_cpu=True, **fields)
    return Trainer(model=model, args=args, train_dataset=CausalTokens())


def checkpoint_calls(tmp_path, monkeypatch, **fields) -> list[dict]:
    """One training step of the tiny GPT-2: the keyword arguments of every call of torch's checkpoint function
    (activation checkpointing recomputes each block in backward through it; transformers binds it when
    checkpointing is enabled, so the recorder sits between transformers and torch)."""
    import transformers.modeling_utils
    from torch.utils.checkpoint import checkpoint

    calls: list[dict] = []

    def recording_checkpoint(function, *args, **kwargs):
        calls.append(kwargs)
        return checkpoint(function, *args, **kwargs)

    monkeypatch.setattr(transformers.modeling_utils, "checkpoint", recording_checkpoint)
    gpt2_trainer(tmp_path, tiny_gpt2(), **fields).train()
    return calls


def p_activation_checkpointing(tmp_path, monkeypatch):
    assert len(checkpoint_calls(tmp_path, monkeypatch, activation_checkpointing=True)) == 2  # 2 blocks (default: 0)


def p_gradient_checkpointing(tmp_path, monkeypatch):
    assert len(checkpoint_calls(tmp_path, monkeypatch, gradient_checkpointing=True)) == 2


NOT_TRANSFORMERS_DEFAULT = {"use_reentrant": False, "preserve_rng_state": False}  # transformers never passes the latter


def p_activation_checkpointing_kwargs(tmp_path, monkeypatch):
    calls = checkpoint_calls(tmp_path, monkeypatch, activation_checkpointing=True,
                             activation_checkpointing_kwargs=NOT_TRANSFORMERS_DEFAULT)
    assert len(calls) == 2 and all(call == NOT_TRANSFORMERS_DEFAULT for call in calls), calls


def p_gradient_checkpointing_kwargs(tmp_path, monkeypatch):
    calls = checkpoint_calls(tmp_path, monkeypatch, gradient_checkpointing=True,
                             gradient_checkpointing_kwargs=NOT_TRANSFORMERS_DEFAULT)
    assert len(calls) == 2 and all(call == NOT_TRANSFORMERS_DEFAULT for call in calls), calls


def p_use_cache(tmp_path):
    """use_cache=True: the model returns its key/value cache while training (the default turns it off)."""
    model = tiny_gpt2()
    model.config.use_cache = False
    caches: list[bool] = []
    model.register_forward_hook(lambda module, inputs, output: caches.append(output.past_key_values is not None))
    gpt2_trainer(tmp_path, model, use_cache=True).train()
    assert caches == [True]


def p_neftune(tmp_path):
    """NEFTune: while training, the input embeddings carry uniform noise of scale alpha / sqrt(length x width)
    (seen by a hook added once training began, after any hook the Trainer adds)."""
    from trainkit import TrainerCallback

    model = tiny_gpt2()
    noise: list[float] = []

    def hook(module, inputs, output):
        if module.training:
            noise.append(float((output - module.weight[inputs[0]]).detach().abs().max()))

    class WatchEmbeddings(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            model.get_input_embeddings().register_forward_hook(hook)

    trainer = gpt2_trainer(tmp_path, model, neftune_noise_alpha=5.0)
    trainer.add_callback(WatchEmbeddings())
    trainer.train()
    bound = 5.0 / (10 * 16) ** 0.5  # 0.395: the noise is uniform in [-bound, bound]
    assert len(noise) == 1 and 0.2 * bound < noise[0] <= bound * (1 + 1e-6), noise  # no noise: exactly 0


# --- compilation: what torch.compile was called with -----------------------------------------------------------
def compile_calls(tmp_path, monkeypatch, **fields) -> list[dict]:
    """Train one step with torch.compile recorded (and left out: the model runs eagerly, so no compiler runs)."""
    calls: list[dict] = []

    def recording_compile(model=None, **kwargs):
        calls.append(kwargs)
        return model

    monkeypatch.setattr(torch, "compile", recording_compile)
    quick(tmp_path, max_steps=1, **fields).train()
    return calls


def p_torch_compile(tmp_path, monkeypatch):
    calls = compile_calls(tmp_path, monkeypatch, torch_compile=True)
    assert [call.get("backend") for call in calls] == ["inductor"]


def p_torch_compile_backend(tmp_path, monkeypatch):
    calls = compile_calls(tmp_path, monkeypatch, torch_compile_backend="aot_eager")
    assert [call.get("backend") for call in calls] == ["aot_eager"]


def p_torch_compile_mode(tmp_path, monkeypatch):
    calls = compile_calls(tmp_path, monkeypatch, torch_compile=True, torch_compile_mode="max-autotune-no-cudagraphs")
    assert [call.get("mode") for call in calls] == ["max-autotune-no-cudagraphs"]


# --- seeds ----------------------------------------------------------------------------------------------------------
def p_seed(tmp_path):
    """model_init runs after the seed: its weights are those torch draws from seed 12 (the default: 42)."""
    from transformers import set_seed

    trainer = quick(tmp_path, seed=12)
    set_seed(12)
    expected = DropoutRegressor().state_dict()
    assert all(torch.equal(trainer.model.state_dict()[k], v) for k, v in expected.items())


def p_full_determinism(tmp_path):
    """torch's deterministic-algorithms switch (restored afterwards)."""
    import os

    before = torch.are_deterministic_algorithms_enabled()
    try:
        torch.use_deterministic_algorithms(False)
        quick(tmp_path, full_determinism=True)
        assert torch.are_deterministic_algorithms_enabled()
    finally:
        torch.use_deterministic_algorithms(before)
        os.environ.pop("CUBLAS_WORKSPACE_CONFIG", None)


def p_data_seed(tmp_path):
    """The training order follows data_seed, whatever the seed (by default it follows the seed)."""
    def first_batches(**seeds) -> torch.Tensor:
        trainer = quick(tmp_path / str(seeds), max_steps=1, **seeds)
        seen = record_forwards(trainer)
        trainer.train()
        return torch.cat([f.inputs for f in seen if f.training])

    same_data_seed = first_batches(seed=1, data_seed=5), first_batches(seed=2, data_seed=5)
    assert torch.equal(*same_data_seed)
    assert not torch.equal(same_data_seed[0], first_batches(seed=1, data_seed=6))


def p_label_smoothing(tmp_path):
    """The evaluation loss is transformers' LabelSmoother over the model's logits (not the model's own loss)."""
    from transformers.trainer_pt_utils import LabelSmoother

    torch.manual_seed(0)
    model, data = TinyTokenModel(), TokenDataset(4)
    args = TrainingArguments(str(tmp_path), label_smoothing_factor=0.3, report_to="none", disable_tqdm=True,
                             per_device_eval_batch_size=4)
    loss = Trainer(model=model, args=args, eval_dataset=data).evaluate()["eval_loss"]
    batch = {"input_ids": data.input_ids, "labels": data.labels}
    with torch.no_grad():
        logits = model(batch["input_ids"])["logits"]
        expected = float(LabelSmoother(epsilon=0.3)({"logits": logits}, batch["labels"]))
        plain = float(model(**batch)["loss"])
    assert abs(expected - plain) > 0.05  # the effect: smoothing moves this loss by ~0.1
    assert loss == pytest.approx(expected, abs=1e-6)  # 1e-6: float noise, 1e-5 of the effect


def p_deepspeed(tmp_path):
    """A DeepSpeed config's optimizer section builds the optimizer (run on torch): its learning rate."""
    trainer = quick(tmp_path, deepspeed={"zero_optimization": {"stage": 0},
                                         "optimizer": {"type": "AdamW", "params": {"lr": 0.125}}})
    trainer.train()
    assert trainer.optimizer.param_groups[0]["initial_lr"] == 0.125  # the workload's own: 0.05


__all__ = [name for name in dir() if name.startswith("p_")]
