"""The storage contract, held on every backend that ships: a shared folder, each node's own folder (one process:
one node), and object stores (fsspec's ``memory://`` and a real S3 server, moto's, over HTTP). One process, CPU.

Each backend must stage invisibly, commit atomically with a manifest written last, list and trust only committed
checkpoints, remove an interrupted write's leftovers, keep a replaced checkpoint readable until its successor is
committed, set a damaged one aside, verify sizes and checksums, and rotate.
"""

from __future__ import annotations

import uuid

import pytest

from tests.object_store import s3, s3_server  # noqa: F401  (fixtures)
from trainkit.engine.checkpoint import CheckpointError, CorruptedCheckpointError, IncompleteCheckpointError
from trainkit.engine.checkpoint.storage import NodeLocalStorage, SharedFolderStorage, storage_for
from trainkit.engine.checkpoint.storage.object_store import ObjectStoreStorage

BACKENDS = ["shared_folder", "node_local", "memory", "s3"]


@pytest.fixture(params=BACKENDS)
def place(request, tmp_path):
    """``(storage, run folder)`` for each backend."""
    if request.param == "shared_folder":
        return SharedFolderStorage(), str(tmp_path / "run")
    if request.param == "node_local":
        return NodeLocalStorage(), str(tmp_path / "run")
    if request.param == "memory":
        return ObjectStoreStorage(), f"memory://contract-{uuid.uuid4().hex[:8]}/run"
    bucket = request.getfixturevalue("s3")
    return ObjectStoreStorage(), f"{bucket.url}/run"


def _save(storage, folder, files: dict[str, bytes], **kwargs) -> str:
    staging = storage.stage(folder, **kwargs)
    for name, data in files.items():
        storage.write_bytes(storage.join(staging, name), data)
    return storage.commit(staging, folder, metadata={"kind": "test"})


def test_a_checkpoint_is_visible_only_once_committed(place):
    storage, run = place
    folder = storage.join(run, "checkpoint_1")
    staging = storage.stage(folder)
    storage.write_bytes(storage.join(staging, "weights.bin"), b"0123456789")
    storage.write_bytes(storage.join(staging, "sub/part.bin"), b"ab")
    assert storage.latest(run) is None and not storage.is_complete(folder)  # staged: not a checkpoint yet
    assert storage.commit(staging, folder) == storage.normalize(folder)
    assert storage.latest(run) == storage.normalize(folder)
    manifest = storage.read(folder)
    assert sorted(manifest["files"]) == ["sub/part.bin", "weights.bin"]
    assert manifest["files"]["weights.bin"]["size"] == 10 and len(manifest["files"]["weights.bin"]["sha256"]) == 64
    files = storage.files_at(folder)
    assert storage.read_bytes(storage.join(files, "sub/part.bin")) == b"ab"


def test_an_abandoned_write_leaves_nothing_and_an_interrupted_one_is_cleaned_by_the_next(place):
    storage, run = place
    folder = storage.join(run, "checkpoint_2")
    staging = storage.stage(folder)
    storage.write_bytes(storage.join(staging, "half.bin"), b"x")
    with pytest.raises(CheckpointError, match="disk full"):
        storage.commit(staging, folder, error="OSError: disk full")
    assert storage.list(run) == []
    # An interrupted write (the process died before its commit) is skipped by readers, removed by the next write.
    staging = storage.stage(folder)
    storage.write_bytes(storage.join(staging, "half.bin"), b"x")
    assert storage.latest(run) is None
    _save(storage, folder, {"whole.bin": b"whole"})
    assert sorted(storage.read(folder)["files"]) == ["whole.bin"]


def test_a_committed_checkpoint_is_refused_or_replaced_whole(place):
    storage, run = place
    folder = storage.join(run, "ckpt")
    _save(storage, folder, {"a.bin": b"old"})
    with pytest.raises(CheckpointError, match="never written into an existing folder"):
        storage.stage(folder)
    staging = storage.stage(folder, replace=True)
    storage.write_bytes(storage.join(staging, "b.bin"), b"new!")
    assert storage.read_bytes(storage.join(storage.files_at(folder), "a.bin")) == b"old"  # still the old one
    storage.commit(staging, folder)
    files = storage.files_at(folder)
    assert sorted(storage.read(folder)["files"]) == ["b.bin"]
    assert storage.read_bytes(storage.join(files, "b.bin")) == b"new!"
    assert set(storage.file_sizes(folder)) == {"manifest.json"} | {f"{files[len(folder) + 1:]}/b.bin".lstrip("/")}


def test_damage_is_found_and_a_damaged_checkpoint_set_aside_by_the_next_save(place):
    storage, run = place
    folder = storage.join(run, "checkpoint_3")
    _save(storage, folder, {"w.bin": b"0123456789"})
    storage.write_bytes(storage.join(storage.files_at(folder), "w.bin"), b"0123456789"[::-1])  # same size
    with pytest.raises(CorruptedCheckpointError, match="w.bin has the wrong SHA-256"):
        storage.read(folder)
    assert storage.is_complete(folder)  # sizes match: only the checksum pass sees it
    _save(storage, folder, {"w.bin": b"fresh"}, set_aside_damaged=True)
    assert storage.read_bytes(storage.join(storage.files_at(folder), "w.bin")) == b"fresh"
    aside = [name for name in storage.list_names(run) if name.startswith("checkpoint_3.damaged-")]
    assert len(aside) == 1 and [e.number for e in storage.list(run)] == [3]  # kept, never listed


def test_rotation_keeps_the_newest_and_the_protected(place):
    storage, run = place
    folders = [_save(storage, storage.join(run, f"checkpoint_{n}"), {"w.bin": bytes([n])}) for n in range(4)]
    deleted = storage.rotate(run, 2, protected=[folders[0]])
    assert deleted == [folders[1], folders[2]]
    assert [e.number for e in storage.list(run)] == [0, 3]


def test_a_missing_manifest_is_incomplete(place):
    storage, run = place
    folder = storage.join(run, "foreign")
    storage.write_bytes(storage.join(folder, "x.bin"), b"x")
    with pytest.raises(IncompleteCheckpointError, match="no manifest.json"):
        storage.read(folder)


def test_a_location_goes_to_the_backend_of_its_form():
    assert type(storage_for("/tmp/run")) is SharedFolderStorage
    assert type(storage_for("file:///tmp/run")) is SharedFolderStorage
    assert type(storage_for("/tmp/run", per_node=True)) is NodeLocalStorage
    assert type(storage_for("memory://bucket/run")) is ObjectStoreStorage
    with pytest.raises(CheckpointError, match=r"No checkpoint storage handles nosuch://.*fsspec knows no 'nosuch'"):
        storage_for("nosuch://bucket/run")
