"""trainkit's Trainer gives transformers' numbers on the same seed, with the installed transformers' Trainer as the
oracle in the same test (CPU, one process; the two-process checks are in test_same_numbers_processes.py).

Dropout, MLM masking, the data order, worker seeds and the causal-LM loss normalisation all draw from or depend on the
same random streams and counts as transformers': per-step losses, gradient norms, evaluation losses and the final
weights are equal to the bit. Resuming keeps that: trainkit's own checkpoints continue bitwise like the uninterrupted
run (dropout and masking), and a checkpoint transformers wrote continues as transformers' own resume does.
"""

from __future__ import annotations

import importlib.util
import re

import pytest
import torch

import trainkit
from tests.trainer.oracle_workload import timeless, train
from trainkit.trainer.training_arguments.fields import installed_transformers_release as transformers_release

import transformers

pytestmark = pytest.mark.timeout(300)
oracle = pytest.mark.skipif(importlib.util.find_spec("accelerate") is None,
                            reason="transformers' Trainer (the oracle) needs Accelerate, absent from this stack")
# the libraries whose Trainer a test runs: trainkit's everywhere, transformers' where it runs (Accelerate installed)
ORACLE_AND_TRAINKIT = (transformers, trainkit) if importlib.util.find_spec("accelerate") else (trainkit,)
# transformers 5.1 names length grouping group_by_length=True, later releases train_sampling_strategy.
GROUP_BY_LENGTH = ({"train_sampling_strategy": "group_by_length"}
                   if "train_sampling_strategy" in transformers.TrainingArguments.__dataclass_fields__
                   else {"group_by_length": True})


def assert_same_run(ours: dict, theirs: dict, resumed: bool = False) -> None:
    keys = ["losses", "grad_norms", "eval_losses"]
    if not resumed or transformers_release() >= (5, 19):  # before, a resumed run's train_loss divided by every step
        keys.append("train_loss")
    for key in keys:
        assert ours[key] == theirs[key], key  # floats from the same tensors: equal to the bit
    # every entry with transformers' keys (per step: loss, grad_norm, learning_rate, epoch, step) and values
    assert timeless(ours["log_history"]) == timeless(theirs["log_history"])
    assert ours["weights"].keys() == theirs["weights"].keys()
    for name, tensor in theirs["weights"].items():
        assert torch.equal(ours["weights"][name], tensor), name


@oracle
@pytest.mark.parametrize("task, extra", [
    ("bert", {}),  # dropout; the evaluations draw a base seed too
    # masking drawn in a worker seeded as transformers seeds it; the token counts logged at each step
    ("mlm", {"dataloader_num_workers": 1, "include_num_input_tokens_seen": "all"}),
    ("gpt2", {"gradient_accumulation_steps": 2}),  # loss over num_items_in_batch as transformers counts it
    # its order drawn from the global RNG at each pass (an evaluation at step 3 too)
    ("llama", GROUP_BY_LENGTH),
])
def test_the_same_numbers_as_transformers_trainer(tmp_path, task, extra):
    theirs = train(transformers, task, str(tmp_path / "transformers"), **extra)
    ours = train(trainkit, task, str(tmp_path / "trainkit"), **extra)
    assert len(ours["losses"]) == 6 and len(ours["eval_losses"]) == 2
    assert_same_run(ours, theirs)


@oracle
@pytest.mark.parametrize("task", ["gpt2", "llama", "mlm"])
def test_num_items_in_batch_is_transformers_count(tmp_path, task):
    """The count handed to the model is the one transformers' Trainer computes for it: from 5.10 a causal LM whose
    loss_type transformers recognises (Llama) leaves out each row's first label, GPT-2 (loss_type unknown) and
    releases before count every label, so transformers' GPT-2 loss reads (L-1)/L of the model's own mean."""
    from tests.trainer.oracle_workload import collator, examples, model

    batches = [collator(task)(examples(4, seed, False)) for seed in (5, 6)]
    counts = []
    for library in (transformers, trainkit):
        args = library.TrainingArguments(str(tmp_path / library.__name__), use_cpu=True, report_to="none")
        trainer = library.Trainer(model=model(task), args=args)
        counts.append(trainer._get_num_items_in_batch(batches, torch.device("cpu")))
    theirs, ours = counts
    assert ours is not None and int(ours) == int(theirs)


@oracle
def test_model_init_reseeds_and_rebuilds_at_every_train_as_transformers(tmp_path):
    """With a model_init, train() seeds and builds a fresh model (and optimizer) each time, as transformers' does: an
    evaluation and a draw of the script's before training change nothing, and a second train() repeats the first."""
    from tests.trainer.oracle_workload import collator, examples, model

    def runs(library):
        losses: list[float] = []

        class Record(library.TrainerCallback):
            def on_log(self, args, state, control, logs=None, **kwargs):
                if "loss" in logs:
                    losses.append(logs["loss"])

        args = library.TrainingArguments(str(tmp_path / library.__name__), per_device_train_batch_size=8, max_steps=3,
                                         logging_steps=1, learning_rate=5e-3, save_strategy="no", report_to="none",
                                         use_cpu=True, disable_tqdm=True, seed=42)
        trainer = library.Trainer(model_init=lambda: model("bert"), args=args, train_dataset=examples(32, 1, True),
                                  eval_dataset=examples(8, 2, True), data_collator=collator("bert"),
                                  callbacks=[Record()])
        trainer.evaluate()  # draws an evaluation pass's base seed from the global generator
        torch.randn(3)
        trainer.train()
        first = trainer.model.classifier.weight.detach().clone()
        trainer.train()
        return losses, first, trainer.model.classifier.weight.detach().clone()

    (theirs, their_first, their_second), (ours, our_first, our_second) = runs(transformers), runs(trainkit)
    assert len(ours) == 6 and ours == theirs
    assert ours[:3] == ours[3:]  # the second train() starts from scratch
    assert torch.equal(our_first, their_first) and torch.equal(our_second, our_first)


def test_resumed_run_ends_bitwise_like_the_uninterrupted_one(tmp_path):
    """Dropout and masking: the checkpoint stores each process's random states and the draws of the pass in
    progress (the batch read ahead was already masked when it was taken)."""
    full = train(trainkit, "mlm", str(tmp_path / "full"))
    run = str(tmp_path / "interrupted")
    first = train(trainkit, "mlm", run, save_strategy="steps", save_steps=2, stop_after=2)
    resumed = train(trainkit, "mlm", run, save_strategy="steps", save_steps=2, resume=f"{run}/checkpoint-2")
    assert first["losses"] + resumed["losses"] == full["losses"]
    assert resumed["eval_losses"] == full["eval_losses"]
    for name, tensor in full["weights"].items():
        assert torch.equal(resumed["weights"][name], tensor), name


@oracle
def test_resuming_a_checkpoint_transformers_wrote(tmp_path):
    """transformers trains 6 steps saving at 3; trainkit resumes from its checkpoint-3: steps 4-6 equal transformers'
    own resumed steps and the uninterrupted run (dropout: transformers restores the random states exactly)."""
    run = str(tmp_path / "transformers")
    uninterrupted = train(transformers, "bert", str(tmp_path / "uninterrupted"))
    train(transformers, "bert", run, save_strategy="steps", save_steps=3, stop_after=3)
    folder = f"{run}/checkpoint-3"
    assert {"optimizer.pt", "scheduler.pt", "rng_state.pth", "training_args.bin"} <= set(
        p.name for p in (tmp_path / "transformers" / "checkpoint-3").iterdir())
    theirs = train(transformers, "bert", run, save_strategy="steps", save_steps=3, resume=folder)
    ours = train(trainkit, "bert", str(tmp_path / "trainkit"), resume=folder)
    assert len(ours["losses"]) == 3
    assert_same_run(ours, theirs, resumed=True)
    assert ours["losses"] == uninterrupted["losses"][3:]
    for name, tensor in uninterrupted["weights"].items():
        assert torch.equal(ours["weights"][name], tensor), name


def test_resuming_from_the_last_checkpoint_trains_nothing_and_reports_transformers_zero_loss(tmp_path):
    """Each Trainer resumes its own final checkpoint, at the end of the last epoch (8 steps, 4 an epoch): no step
    runs, train_loss is 0.0 (it was NaN) and, where transformers' Trainer runs here, the history (restored from the
    checkpoint, plus the closing entry) is transformers'. (A final step inside an epoch is not an end for either:
    both train that epoch's next window.)"""
    outputs = {}
    for library in ORACLE_AND_TRAINKIT:
        run = str(tmp_path / library.__name__)
        train(library, "bert", run, max_steps=8, save_strategy="steps", save_steps=4)
        outputs[library.__name__] = train(library, "bert", run, max_steps=8, save_strategy="steps", save_steps=4,
                                          resume=f"{run}/checkpoint-8")
    for output in outputs.values():
        assert output["losses"] == [] and output["train_loss"] == 0.0
    if "transformers" in outputs:
        assert timeless(outputs["trainkit"]["log_history"]) == timeless(outputs["transformers"]["log_history"])


@oracle
def test_a_causal_lm_resumed_from_transformers_mid_epoch_with_accumulation(tmp_path):
    """The data position (two windows of two batches skipped) and the schedule continue as in transformers."""
    run = str(tmp_path / "transformers")
    extra = dict(gradient_accumulation_steps=2, max_steps=3, per_device_train_batch_size=4)
    train(transformers, "llama", run, save_strategy="steps", save_steps=1, stop_after=1, **extra)
    theirs = train(transformers, "llama", run, save_strategy="no", resume=f"{run}/checkpoint-1", **extra)
    ours = train(trainkit, "llama", str(tmp_path / "trainkit"), resume=f"{run}/checkpoint-1", **extra)
    assert len(ours["losses"]) == 2
    assert_same_run(ours, theirs, resumed=True)


def test_a_folder_of_neither_trainer_is_still_refused(tmp_path):
    folder = tmp_path / "checkpoint-3"
    folder.mkdir()
    (folder / "trainer_state.json").write_text("{}")
    from trainkit.engine.checkpoint import IncompleteCheckpointError

    with pytest.raises(IncompleteCheckpointError, match="manifest"):
        train(trainkit, "bert", str(tmp_path / "run"), resume=str(folder))


@oracle
def test_get_batch_samples_and_the_sampler_hooks_are_called_as_transformers_calls_them(tmp_path):
    """5 batches per epoch, windows of 2: get_batch_samples is asked for 2, 2, then for the 1 batch left, each epoch; the sampler hooks are called with the training and evaluation sets; what a hook returns is used."""
    from tests.trainer.oracle_workload import collator, examples, model

    def recorded(library):
        calls: list = []

        class Recording(library.Trainer):
            def get_batch_samples(self, epoch_iterator, num_batches, device):
                batches, count = super().get_batch_samples(epoch_iterator, num_batches, device)
                calls.append(("get_batch_samples", num_batches, len(batches), None if count is None else int(count)))
                return batches, count

            def _get_train_sampler(self, train_dataset=None):
                calls.append(("_get_train_sampler", len(train_dataset)))
                return torch.utils.data.SequentialSampler(train_dataset)  # honoured: the data in order

            def _get_eval_sampler(self, eval_dataset):
                calls.append(("_get_eval_sampler", len(eval_dataset)))
                return super()._get_eval_sampler(eval_dataset)

        args = library.TrainingArguments(str(tmp_path / library.__name__), per_device_train_batch_size=2,
                                         gradient_accumulation_steps=2, num_train_epochs=2, eval_strategy="epoch",
                                         save_strategy="no", report_to="none", use_cpu=True, disable_tqdm=True)
        torch.manual_seed(0)
        trainer = Recording(model=model("gpt2"), args=args, train_dataset=examples(10, 1, False),
                            eval_dataset=examples(4, 2, False), data_collator=collator("gpt2"))
        trainer.train()
        return calls

    theirs, ours = recorded(transformers), recorded(trainkit)
    assert [call[:3] for call in ours if call[0] == "get_batch_samples"] == [("get_batch_samples", 2, 2),
                                                                            ("get_batch_samples", 2, 2),
                                                                            ("get_batch_samples", 1, 1)] * 2
    # transformers rebuilds its evaluation loader (so asks for its sampler) at every evaluation; trainkit builds it once.
    assert [call for call in ours if call[0] != "_get_eval_sampler"] == [
        call for call in theirs if call[0] != "_get_eval_sampler"]
    assert ("_get_eval_sampler", 4) in ours


def test_a_missing_checkpoint_is_refused_with_transformers_error(tmp_path):
    """A folder that does not exist, and resume_from_checkpoint=True with no checkpoint in output_dir: the same
    ValueError as transformers' Trainer (compared where it runs here), whose words scripts and its own tests match;
    nothing is trained."""
    from tests.trainer.helpers import EchoModel, IndexDataset

    bogus = str(tmp_path / "checkpoint-5-bogus")
    for library in ORACLE_AND_TRAINKIT:
        output_dir = str(tmp_path / library.__name__)
        args = library.TrainingArguments(output_dir, use_cpu=True, report_to="none", max_steps=1)
        trainer = library.Trainer(model=EchoModel(), args=args, train_dataset=IndexDataset())
        with pytest.raises(ValueError, match=re.escape(f"Can't find a valid checkpoint at {bogus}")):
            trainer.train(resume_from_checkpoint=bogus)
        with pytest.raises(ValueError, match=re.escape(f"No valid checkpoint found in output directory ({output_dir})")):
            trainer.train(resume_from_checkpoint=True)
        assert trainer.state.global_step == 0
