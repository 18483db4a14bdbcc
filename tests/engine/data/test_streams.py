"""Streamed datasets on one process (CPU): shard protocol, positions, state round-trips, dispatch slicing, errors."""

from __future__ import annotations

import json

import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset

from trainkit import Accelerator
from trainkit.engine.data.dispatch import split_global_batch
from trainkit.engine.data.streams import StreamShard, _deal_again


class Shards(IterableDataset):
    """3 shards of 5 ids that seek to ``start``; remembers what it read."""

    num_shards = 3

    def __init__(self) -> None:
        self.read: list[int] = []

    def iter_shard(self, index, start=0):
        for offset in range(start, 5):
            self.read.append(index * 10 + offset)
            yield torch.tensor(index * 10 + offset)

    def __iter__(self):
        for index in range(self.num_shards):
            yield from self.iter_shard(index)


class Plain(IterableDataset):
    def __init__(self, size: int) -> None:
        self.size = size

    def __iter__(self):
        return iter(torch.arange(self.size))

    def __len__(self) -> int:
        return self.size


def _ids(loader) -> list[int]:
    return [i for batch in loader for i in batch.tolist()]


@pytest.fixture(scope="module")
def accelerator() -> Accelerator:
    return Accelerator(cpu=True)


def test_a_stopped_epoch_continues_at_the_next_example_reading_nothing_before_it(accelerator):
    first = accelerator.prepare(DataLoader(Shards(), batch_size=2))
    seen = []
    for step, batch in enumerate(first):
        seen += batch.tolist()
        if step == 2:
            state = json.loads(json.dumps(first.state_dict()))  # what a checkpoint stores
            break
    data = Shards()
    resumed = accelerator.prepare(DataLoader(data, batch_size=2))
    resumed.load_state_dict(state)
    rest = _ids(resumed)
    assert seen + rest == [0, 1, 2, 3, 4, 10, 11, 12, 13, 14, 20, 21, 22, 23, 24]
    assert data.read == rest  # shard 1 opened at its 2nd record: nothing before it is read


def test_a_stream_without_shards_is_read_in_order_and_keeps_its_length(accelerator):
    loader = accelerator.prepare(DataLoader(Plain(7), batch_size=3))
    assert len(loader) == 3
    assert loader.dataset.mode == "positions"
    assert _ids(loader) == list(range(7))


def test_unread_work_is_dealt_again_partly_read_shards_first():
    work = [[[3, 7], [5, None]], [[4, 2]], []]
    assert _deal_again(work, 2) == [[[3, 7], [5, None]], [[4, 2]]]
    assert _deal_again(work, 1) == [[[3, 7], [4, 2], [5, None]]]


def test_a_position_split_stream_refuses_another_layout_with_a_clear_error():
    shard = StreamShard(Plain(8), batch_size=2, num_processes=1, process_index=0, num_workers=0,
                        drop_last=False, even_batches=True, seed=0)
    state = {"format": "trainkit-stream/1", "mode": "positions", "epoch": 0, "num_processes": 2, "num_workers": 1,
             "num_shards": 1, "rotation": [0, 0], "work": {"0": [[0, 4]], "1": [[0, 5]]}}
    with pytest.raises(ValueError, match="same layout"):
        shard.load_state_dict(state)
    state.update(num_shards=4, mode="shards")
    with pytest.raises(ValueError, match="not the same stream"):
        shard.load_state_dict(state)


def test_dispatch_slices_a_short_global_batch_into_full_slices_with_real_counts():
    batch = {"x": torch.arange(5), "y": torch.arange(5) * 10}
    slices, real = split_global_batch(batch, 2, 3)
    assert slices[0]["x"].tolist() == [0, 1, 2] and slices[1]["x"].tolist() == [3, 4, 0]
    assert real == [3, 2]


def test_a_mapped_json_stream_is_read_by_files_and_resumes_from_the_datasets_state(accelerator, tmp_path):
    from datasets import load_dataset

    paths = []
    for number in range(3):
        path = tmp_path / f"{number}.jsonl"
        path.write_text("".join(json.dumps({"id": number * 10 + i}) + "\n" for i in range(4)))
        paths.append(str(path))
    mapped: list[int] = []

    def stream():
        return load_dataset("json", data_files=paths, streaming=True, split="train").map(
            lambda e: (mapped.append(e["id"]), {"double": 2 * e["id"]})[1])

    first = accelerator.prepare(DataLoader(stream(), batch_size=3))
    assert first.dataset.mode == "shards"
    iterator = iter(first)
    before = [next(iterator)["id"].tolist() for _ in range(2)]
    state = first.state_dict()
    del iterator
    mapped.clear()
    resumed = accelerator.prepare(DataLoader(stream(), batch_size=3))
    resumed.load_state_dict(state)
    rest = [i for batch in resumed for i in batch["id"].tolist()]
    assert sum(before, []) + rest == [0, 1, 2, 3, 10, 11, 12, 13, 20, 21, 22, 23]
    assert mapped == rest  # the file reader skipped the consumed records before map


def test_a_single_file_stream_is_split_under_its_map_so_each_reader_maps_only_its_records(tmp_path):
    from datasets import load_dataset

    from trainkit.engine.data.stream_sources import HFPositionSource, source_for, split_under_transforms

    path = tmp_path / "one.jsonl"
    path.write_text("".join(json.dumps({"id": i}) + "\n" for i in range(7)))
    mapped: list[int] = []
    stream = load_dataset("json", data_files=[str(path)], streaming=True, split="train").map(
        lambda e: (mapped.append(e["id"]), {"double": 2 * e["id"]})[1])
    assert isinstance(source_for(stream, min_shards=2), HFPositionSource)
    part = split_under_transforms(stream, 3, 1)
    assert [e["id"] for e in part] == [1, 4] and mapped == [1, 4]  # the records of reader 1 of 3, mapped alone


def test_moving_a_restored_stream_back_to_its_epoch_start_reads_the_whole_epoch(accelerator):
    first = accelerator.prepare(DataLoader(Shards(), batch_size=2))
    iterator = iter(first)
    next(iterator)
    state = first.state_dict()
    del iterator
    resumed = accelerator.prepare(DataLoader(Shards(), batch_size=2))
    resumed.load_state_dict(state)
    resumed.progress.move_to(resumed.progress.epoch)  # what the Trainer's ignore_data_skip does
    assert _ids(resumed) == [0, 1, 2, 3, 4, 10, 11, 12, 13, 14, 20, 21, 22, 23, 24]


def test_a_shuffled_filtered_stream_resumes_exactly_once_though_its_buffer_is_not_saved(accelerator, tmp_path):
    from datasets import load_dataset

    paths = []
    for number in range(3):
        path = tmp_path / f"{number}.jsonl"
        path.write_text("".join(json.dumps({"id": number * 10 + i}) + "\n" for i in range(6)))
        paths.append(str(path))

    def stream():
        data = load_dataset("json", data_files=paths, streaming=True, split="train")
        return data.filter(lambda e: e["id"] % 3 != 0).shuffle(seed=5, buffer_size=4)

    first = accelerator.prepare(DataLoader(stream(), batch_size=2))
    iterator = iter(first)
    before = [i for _ in range(3) for i in next(iterator)["id"].tolist()]
    state = json.loads(json.dumps(first.state_dict()))
    rest_of_uninterrupted = [i for batch in iterator for i in batch["id"].tolist()]
    resumed = accelerator.prepare(DataLoader(stream(), batch_size=2))
    resumed.load_state_dict(state)
    rest = [i for batch in resumed for i in batch["id"].tolist()]
    assert rest == rest_of_uninterrupted
    assert sorted(before + rest) == [i for i in range(26) if i % 10 < 6 and i % 3 != 0]


def test_a_parquet_stream_read_by_two_workers_resumes_exactly_once(accelerator, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq
    from datasets import load_dataset

    paths = []
    for number in range(3):
        path = str(tmp_path / f"{number}.parquet")
        pq.write_table(pa.table({"id": list(range(number * 10, number * 10 + 5))}), path)
        paths.append(path)

    def loader():
        stream = load_dataset("parquet", data_files=paths, streaming=True, split="train")
        return accelerator.prepare(DataLoader(stream, batch_size=2, num_workers=2))

    first = loader()
    iterator = iter(first)
    before = [i for _ in range(3) for i in next(iterator)["id"].tolist()]
    state = json.loads(json.dumps(first.state_dict()))
    del iterator
    resumed = loader()
    resumed.load_state_dict(state)
    rest = [i for batch in resumed for i in batch["id"].tolist()]
    assert sorted(before + rest) == [n * 10 + i for n in range(3) for i in range(5)]
