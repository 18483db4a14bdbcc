"""The Trainer on streams, one process (CPU): columns unknown until read, epochs of a sized stream, predict."""

from __future__ import annotations

import json

import torch

from tests.trainer.helpers import EchoModel
from trainkit import Trainer, TrainingArguments


def _args(tmp_path, **extra):
    settings = dict(output_dir=str(tmp_path / "out"), disable_tqdm=True, report_to="none", save_strategy="no",
                    per_device_train_batch_size=2, per_device_eval_batch_size=3, learning_rate=0.1, use_cpu=True)
    settings.update(extra)
    return TrainingArguments(**settings)


def _mapped_stream(tmp_path, size: int):
    from datasets import load_dataset

    path = tmp_path / "data.jsonl"
    path.write_text("".join(json.dumps({"value": i, "text": f"row {i}"}) + "\n" for i in range(size)))
    stream = load_dataset("json", data_files=[str(path)], streaming=True, split="train")
    return stream.map(lambda e: {"x": [float(e["value"])], "labels": float(e["value"])})


def test_a_mapped_stream_with_unknown_columns_trains_after_dropping_unused_keys(tmp_path):
    stream = _mapped_stream(tmp_path, 10)
    assert stream.column_names is None
    trainer = Trainer(model=EchoModel(), args=_args(tmp_path, max_steps=4), train_dataset=stream)
    assert trainer.train().global_step == 4  # "value" and "text" were dropped before collating


def test_predict_and_evaluate_on_a_stream_return_every_example_once(tmp_path):
    trainer = Trainer(model=EchoModel(), args=_args(tmp_path))
    output = trainer.predict(_mapped_stream(tmp_path, 8))
    assert output.predictions.tolist() == [float(i) for i in range(8)]
    assert output.label_ids.tolist() == [float(i) for i in range(8)]
    assert trainer.evaluate(_mapped_stream(tmp_path, 8))["eval_loss"] == 0.0


class SizedStream(torch.utils.data.IterableDataset):
    def __iter__(self):
        for i in range(6):
            yield {"x": torch.tensor([float(i)]), "labels": torch.tensor(float(i))}

    def __len__(self) -> int:
        return 6


def test_a_stream_with_a_length_trains_for_epochs(tmp_path):
    trainer = Trainer(model=EchoModel(), args=_args(tmp_path, num_train_epochs=2), train_dataset=SizedStream())
    assert trainer.train().global_step == 6  # 2 epochs of 3 batches
    assert trainer.state.epoch == 2
