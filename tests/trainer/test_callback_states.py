"""Callbacks as transformers has them: importable built-ins, and ``stateful_callbacks`` in ``trainer_state.json``
with transformers' JSON shape (the TrainerControl and every ExportableState callback), restored on resume with
``restore_callback_states_from_checkpoint`` (CPU, one process)."""

from __future__ import annotations

import json

import transformers
from transformers import trainer_callback

from tests.trainer.helpers import EchoModel, IndexDataset
from trainkit import (DefaultFlowCallback, EarlyStoppingCallback, PrinterCallback, ProgressCallback, Trainer,
                      TrainerControl, TrainerState, TrainingArguments)
from trainkit.trainer import ExportableState


def _args(tmp_path, **extra):
    settings = dict(output_dir=str(tmp_path / "out"), per_device_train_batch_size=4, learning_rate=0.1,
                    report_to="none", use_cpu=True, disable_tqdm=True, logging_steps=1)
    settings.update(extra)
    return TrainingArguments(**settings)


def test_built_in_callbacks_are_removable_by_class(tmp_path):
    trainer = Trainer(model=EchoModel(), args=_args(tmp_path))
    kinds = [type(cb) for cb in trainer.callback_handler.callbacks]
    assert DefaultFlowCallback in kinds and PrinterCallback in kinds and ProgressCallback not in kinds
    trainer.remove_callback(PrinterCallback)
    assert PrinterCallback not in [type(cb) for cb in trainer.callback_handler.callbacks]
    with_bar = Trainer(model=EchoModel(), args=_args(tmp_path, disable_tqdm=False))
    assert isinstance(with_bar.pop_callback(ProgressCallback), ProgressCallback)


def test_stateful_callbacks_have_transformers_json_shape():
    """The same objects give the same ``stateful_callbacks`` under both libraries (two of one class: a list)."""
    def shape(module):
        stopping = [module.EarlyStoppingCallback(3, 0.25), module.EarlyStoppingCallback(5)]
        stopping[0].early_stopping_patience_counter = 2
        control = module.TrainerControl(should_save=True)
        return module.TrainerState(stateful_callbacks=[control, *stopping]).stateful_callbacks

    import trainkit.trainer as ours

    assert shape(ours) == shape(trainer_callback)


def test_checkpoints_store_the_control_and_callbacks_and_resume_restores_them(tmp_path):
    """A checkpoint's trainer_state.json holds the TrainerControl and EarlyStoppingCallback states; a resumed run
    with restore_callback_states_from_checkpoint rebuilds both from it (and not without)."""
    args = _args(tmp_path, max_steps=4, save_strategy="steps", save_steps=2, eval_strategy="steps", eval_steps=1,
                 metric_for_best_model="loss", greater_is_better=True)  # eval_loss shrinks: every evaluation misses
    trainer = Trainer(model=EchoModel(), args=args, train_dataset=IndexDataset(16, shift=3.0),
                      eval_dataset=IndexDataset(8, shift=3.0), callbacks=[EarlyStoppingCallback(10)])
    trainer.train()
    saved = json.loads((tmp_path / "out" / "checkpoint-2" / "trainer_state.json").read_text())["stateful_callbacks"]
    assert set(saved) == {"TrainerControl", "EarlyStoppingCallback"}
    assert saved["TrainerControl"] == {"args": {"should_training_stop": False, "should_epoch_stop": False,
                                                "should_save": True, "should_evaluate": False, "should_log": False},
                                       "attributes": {}}
    assert saved["EarlyStoppingCallback"] == {"args": {"early_stopping_patience": 10, "early_stopping_threshold": 0.0},
                                              "attributes": {"early_stopping_patience_counter": 1}}
    for restore, counter in ((True, 1 + 2), (False, 2)):
        resumed = Trainer(model=EchoModel(), args=_args(tmp_path, max_steps=4, save_strategy="no", eval_strategy="steps",
                                                        eval_steps=1, metric_for_best_model="loss",
                                                        greater_is_better=True,
                                                        restore_callback_states_from_checkpoint=restore),
                          train_dataset=IndexDataset(16, shift=3.0), eval_dataset=IndexDataset(8, shift=3.0),
                          callbacks=[EarlyStoppingCallback(10)])
        resumed.train(resume_from_checkpoint=str(tmp_path / "out" / "checkpoint-2"))
        assert resumed.pop_callback(EarlyStoppingCallback).early_stopping_patience_counter == counter, restore


def test_a_trainer_state_written_by_transformers_restores_trainkits_callbacks(tmp_path):
    """transformers' own TrainerState.save_to_json (its classes, its file) read by trainkit and restored."""
    stopping = trainer_callback.EarlyStoppingCallback(4, 0.5)
    stopping.early_stopping_patience_counter = 3
    theirs = transformers.TrainerState(global_step=7, stateful_callbacks=[
        trainer_callback.TrainerControl(should_training_stop=True), stopping])
    theirs.save_to_json(str(tmp_path / "trainer_state.json"))

    trainer = Trainer(model=EchoModel(), args=_args(tmp_path, restore_callback_states_from_checkpoint=True),
                      callbacks=[EarlyStoppingCallback()])
    trainer.state = TrainerState.load_from_json(str(tmp_path / "trainer_state.json"))
    trainer._load_callback_state()
    restored = trainer.pop_callback(EarlyStoppingCallback)
    assert (restored.early_stopping_patience, restored.early_stopping_threshold) == (4, 0.5)
    assert restored.early_stopping_patience_counter == 3
    assert isinstance(trainer.control, TrainerControl) and trainer.control.should_training_stop


def test_exportable_state_rebuilds_a_callback_from_its_state():
    class Counter(trainer_callback.TrainerCallback, ExportableState):
        def __init__(self, start: int = 0):
            self.start, self.count = start, start

        def state(self):
            return {"args": {"start": self.start}, "attributes": {"count": self.count}}

    rebuilt = Counter.from_state({"args": {"start": 2}, "attributes": {"count": 9}})
    assert (rebuilt.start, rebuilt.count) == (2, 9)


class _Tagged(trainer_callback.TrainerCallback, trainer_callback.ExportableState):
    """A callback written for transformers.Trainer: transformers' own ExportableState, one constructor value."""

    def __init__(self, tag: str = "default"):
        self.tag = tag

    def state(self):
        return {"args": {"tag": self.tag}, "attributes": {}}


def test_callbacks_written_for_transformers_keep_their_states_one_per_instance(tmp_path, caplog):
    """Two instances of a callback built on transformers' ExportableState are stored (a list, in order) and each
    restored into its counterpart; a stored state whose callback is absent is named in a warning on the
    Trainer's logger."""
    args = _args(tmp_path, max_steps=2, save_strategy="steps", save_steps=2)
    Trainer(model=EchoModel(), args=args, train_dataset=IndexDataset(16),
            callbacks=[_Tagged("first"), _Tagged("second")]).train()
    checkpoint = tmp_path / "out" / "checkpoint-2"
    saved = json.loads((checkpoint / "trainer_state.json").read_text())["stateful_callbacks"]
    assert saved["_Tagged"] == [{"args": {"tag": "first"}, "attributes": {}},
                                {"args": {"tag": "second"}, "attributes": {}}]

    resumed = Trainer(model=EchoModel(), args=_args(tmp_path, max_steps=2, save_strategy="no",
                                                    restore_callback_states_from_checkpoint=True),
                      train_dataset=IndexDataset(16), callbacks=[_Tagged(), _Tagged()])
    resumed.train(resume_from_checkpoint=str(checkpoint))
    assert [cb.tag for cb in resumed.callback_handler.callbacks if isinstance(cb, _Tagged)] == ["first", "second"]

    without = Trainer(model=EchoModel(), args=_args(tmp_path, max_steps=2, save_strategy="no",
                                                    restore_callback_states_from_checkpoint=True),
                      train_dataset=IndexDataset(16))
    with caplog.at_level("WARNING", logger="trainkit.trainer.trainer"):
        without.train(resume_from_checkpoint=str(checkpoint))
    assert [r.msg for r in caplog.records if r.name == "trainkit.trainer.trainer" and "_Tagged" in r.msg] == [
        "The checkpoint holds the states of callbacks this run does not have: _Tagged."]
