"""``on_disk_cache`` / ``end_caching``: files made once and reused, in the items' order
whether cached or not; checks by hash and by function; one file per item or several (an
archive's members); whole files only; one maker per file across processes; resume at
every cut, from a cold cache and a warm one."""

from __future__ import annotations

import hashlib
import io
import os
import tarfile
import threading
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from conveyor import DataLoader2, MultiProcessingReadingService
from conveyor.errors import CacheTimeoutError, GraphError, HashMismatchError
from conveyor.pipes import IterableWrapper, IterDataPipe
from conveyor.pipes.io.cache_lock import LOCK_SUFFIX, making
from conveyor.pipes.io.disk_cache import LIST_SUFFIX
from resume_checks import check_resume_at_every_cut, json_state

pytestmark = pytest.mark.timeout(120)

NAMES = [f"item-{i}" for i in range(6)]


def content(name: str) -> bytes:
    return f"the data of {name}\n".encode() * 3


def cached_path(root: str, name: str) -> str:
    return os.path.join(root, "cache", f"{name}.bin")


def download(log: str, name: str) -> tuple[str, bytes]:
    """Stands in for a download; appends the name to ``log`` (one write: processes share it)."""
    with open(log, "a") as out:
        out.write(name + "\n")
    return name, content(name)


def made(log: str) -> list[str]:
    return open(log).read().split() if os.path.exists(log) else []


def cache_of(root: str, names: list[str] = NAMES, **holder: Any) -> IterDataPipe:
    where = partial(cached_path, root)
    return (
        IterableWrapper(names)
        .on_disk_cache(filepath_fn=where, **holder)
        .map(partial(download, os.path.join(root, "log")))
        .end_caching(mode="wb", filepath_fn=where)
    )


def digests(root: str, names: list[str] = NAMES) -> dict[str, str]:
    return {cached_path(root, name): hashlib.sha256(content(name)).hexdigest() for name in names}


def test_files_are_made_once_then_read_from_disk(tmp_path: Path) -> None:
    root = str(tmp_path)
    pipe = cache_of(root)
    expected = [cached_path(root, name) for name in NAMES]
    assert list(pipe) == expected
    assert [Path(path).read_bytes() for path in expected] == [content(name) for name in NAMES]
    assert list(pipe) == expected and list(cache_of(root)) == expected  # another epoch, another run
    assert made(os.path.join(root, "log")) == NAMES
    assert sorted(os.listdir(tmp_path / "cache")) == sorted(f"{name}.bin" for name in NAMES)  # no partials, locks


def test_a_partly_warm_cache_keeps_the_items_order_and_makes_only_what_is_missing(tmp_path: Path) -> None:
    root = str(tmp_path)
    expected = list(cache_of(root))
    for name in ("item-1", "item-4"):
        os.unlink(cached_path(root, name))
    assert list(cache_of(root)) == expected
    assert made(os.path.join(root, "log")) == [*NAMES, "item-1", "item-4"]


def test_hash_dict_decides_what_is_cached_and_checks_what_is_made(tmp_path: Path) -> None:
    root = str(tmp_path)
    hashes = digests(root)
    log = os.path.join(root, "log")
    list(cache_of(root, hash_dict=hashes))
    Path(cached_path(root, "item-2")).write_bytes(b"corrupted")  # on disk, but not matching
    assert list(cache_of(root, hash_dict=hashes)) == [cached_path(root, name) for name in NAMES]
    assert made(log) == [*NAMES, "item-2"]
    assert Path(cached_path(root, "item-2")).read_bytes() == content("item-2")

    wrong = {**hashes, cached_path(root, "item-3"): hashlib.sha256(b"other").hexdigest()}
    os.unlink(cached_path(root, "item-3"))
    with pytest.raises(HashMismatchError, match=r"item-3\.bin.*corrupt or the hash is wrong"):
        list(cache_of(root, hash_dict=wrong))
    assert not os.path.exists(cached_path(root, "item-3"))  # nothing saved
    assert not [name for name in os.listdir(tmp_path / "cache") if name.endswith(".partial")]

    with pytest.raises(HashMismatchError, match=r"no hash is given for .*item-3\.bin"):
        list(cache_of(root, hash_dict={key: value for key, value in hashes.items() if "item-3" not in key}))


def test_md5_and_extra_check_fn(tmp_path: Path) -> None:
    root = str(tmp_path)
    hashes = {cached_path(root, name): hashlib.md5(content(name)).hexdigest() for name in NAMES}
    list(cache_of(root, hash_dict=hashes, hash_type="md5"))
    list(cache_of(root, hash_dict=hashes, hash_type="md5"))
    checked: list[str] = []

    def fresh_unless_item_5(path: str) -> bool:
        checked.append(path)
        return "item-5" not in path

    list(cache_of(root, extra_check_fn=fresh_unless_item_5))
    assert made(os.path.join(root, "log")) == [*NAMES, "item-5"]
    # item-5 is checked again once its maker holds the lock (another process may have made it)
    assert checked == [cached_path(root, name) for name in NAMES] + [cached_path(root, "item-5")]


def write_archive(path: Path, members: int) -> None:
    with tarfile.open(path, "w") as archive:
        for m in range(members):
            data = f"{path.stem} member {m}\n".encode()
            info = tarfile.TarInfo(f"{path.stem}/m{m}.txt")
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))


def extracted_path(root: str, member: str) -> str:
    return os.path.join(root, "extracted", *member.split(os.sep)[-2:])


def extraction_of(root: str, archives: list[str]) -> IterDataPipe:
    return (
        IterableWrapper(archives)
        .on_disk_cache(filepath_fn=partial(extracted_path, root))
        .open_files(mode="b")
        .load_from_tar()
        .end_caching(filepath_fn=partial(extracted_path, root))
    )


def test_an_item_made_into_several_files_is_cached_as_their_list(tmp_path: Path) -> None:
    archives = []
    for name, members in (("a", 3), ("b", 1), ("c", 2)):
        write_archive(tmp_path / f"{name}.tar", members)
        archives.append(str(tmp_path / f"{name}.tar"))
    root = str(tmp_path)
    expected = [
        extracted_path(root, f"{n}/m{m}.txt") for n, count in (("a", 3), ("b", 1), ("c", 2)) for m in range(count)
    ]
    assert list(extraction_of(root, archives)) == expected
    listing = Path(extracted_path(root, archives[0]) + LIST_SUFFIX).read_text().splitlines()
    assert listing == expected[:3]
    assert Path(expected[4]).read_text() == "c member 0\n"
    for archive in archives:
        os.rename(archive, archive + ".moved")  # cached: the archives are not read again
    assert list(extraction_of(root, archives)) == expected
    os.rename(archives[0] + ".moved", archives[0])
    os.unlink(expected[1])  # a listed file gone: that archive is extracted again
    assert list(extraction_of(root, archives)) == expected


def test_resume_at_every_cut_from_a_cold_cache(tmp_path: Path) -> None:
    """The cut may fall inside an archive's members whose list is not written yet, or
    between items; each cut resumes over the cache the interrupted run left."""
    for name, members in (("a", 3), ("b", 2)):
        write_archive(tmp_path / f"{name}.tar", members)
    archives = [str(tmp_path / "a.tar"), str(tmp_path / "b.tar")]
    full = list(extraction_of(str(tmp_path / "reference"), archives))
    for cut in range(len(full) + 1):
        root = str(tmp_path / f"cut-{cut}")
        a = DataLoader2(extraction_of(root, archives))
        it = iter(a)
        first = [next(it) for _ in range(cut)]
        state = json_state(a)
        a.shutdown()
        b = DataLoader2(extraction_of(root, archives))
        b.load_state_dict(state)
        rest = [] if cut == len(full) else list(b)  # after the last item: the next epoch
        b.shutdown()
        assert [p.replace(root, "R") for p in first + rest] == [
            p.replace(str(tmp_path / "reference"), "R") for p in full
        ]
        assert all(Path(path).exists() for path in first + rest), cut


def test_resume_at_every_cut_from_a_warm_cache_and_with_a_shuffle_before(tmp_path: Path) -> None:
    root = str(tmp_path)
    list(cache_of(root))
    where = partial(cached_path, root)
    check_resume_at_every_cut(
        lambda: (
            IterableWrapper(NAMES)
            .shuffle()
            .on_disk_cache(filepath_fn=where)
            .map(partial(download, os.path.join(root, "log")))
            .end_caching(filepath_fn=where)
        ),
        seed=3,
        cut_epochs=(0, 1),
    )
    assert made(os.path.join(root, "log")) == NAMES


def test_workers_sharing_a_cache_make_each_file_once(tmp_path: Path) -> None:
    """Caching before the sharding point, as torchdata's examples do: every worker reads
    every item, and the first to need a file makes it while the other waits."""
    root = str(tmp_path)
    names = [f"item-{i}" for i in range(24)]
    loader = DataLoader2(
        cache_of(root, names).sharding_filter().map(lambda path: Path(path).read_bytes()),
        reading_service=MultiProcessingReadingService(num_workers=2),
    )
    try:
        assert list(loader) == [content(name) for name in names]
        assert sorted(made(os.path.join(root, "log"))) == sorted(names)
        assert list(loader) == [content(name) for name in names]
    finally:
        loader.shutdown()
    assert sorted(made(os.path.join(root, "log"))) == sorted(names)


def test_a_file_another_process_is_making_is_waited_for_within_timeout(tmp_path: Path) -> None:
    root = str(tmp_path)
    target = cached_path(root, "item-0")
    holding, release = threading.Event(), threading.Event()

    def maker() -> None:
        with making(target, timeout=5, where="test"):
            holding.set()
            release.wait(timeout=30)
            Path(target).write_bytes(content("item-0"))

    thread = threading.Thread(target=maker)
    thread.start()
    try:
        assert holding.wait(timeout=30)
        pipe = IterableWrapper(["item-0"]).on_disk_cache(filepath_fn=partial(cached_path, root))
        waiting = pipe.map(partial(download, os.path.join(root, "log"))).end_caching(
            filepath_fn=partial(cached_path, root), timeout=0.2
        )
        with pytest.raises(CacheTimeoutError, match=r"waited 0\.2 s for another process to finish making"):
            list(waiting)
        release.set()
        thread.join(timeout=30)
        assert list(cache_of(root, ["item-0"])) == [target]
        assert made(os.path.join(root, "log")) == []  # the other maker's file was taken
        assert not os.path.exists(target + LOCK_SUFFIX)
    finally:
        release.set()
        thread.join(timeout=30)


def test_text_mode_streams_and_the_same_filepath_fn(tmp_path: Path) -> None:
    root = str(tmp_path)
    where = partial(cached_path, root)
    text = (
        IterableWrapper(["x", "y"])
        .on_disk_cache(filepath_fn=where)
        .map(lambda name: (name, io.StringIO(f"text {name}")))
        .end_caching(mode="w", same_filepath_fn=True)
    )
    assert list(text) == [where("x"), where("y")]
    assert Path(where("y")).read_text() == "text y"
    with pytest.raises(TypeError, match=r"skip_read=True, but the data .* is a stream"):
        list(
            IterableWrapper(["z"])
            .on_disk_cache(filepath_fn=where)
            .map(lambda name: (name, io.BytesIO(b"z")))
            .end_caching(same_filepath_fn=True, skip_read=True)
        )
    with pytest.raises(TypeError, match=r"must be bytes or a binary stream, got str"):
        list(
            IterableWrapper(["w"])
            .on_disk_cache(filepath_fn=where)
            .map(lambda n: (n, "text"))
            .end_caching(filepath_fn=where)
        )
    with pytest.raises(TypeError, match=r"\(metadata, data\) pairs"):
        list(IterableWrapper(["v"]).on_disk_cache(filepath_fn=where).end_caching())


class WithLabels(IterDataPipe):
    """A user's op, torchdata style: it reads a second iterable beside its input."""

    def __init__(self, source: IterDataPipe, labels: IterDataPipe) -> None:
        self.source, self.labels = source, labels

    def __iter__(self):  # type: ignore[no-untyped-def]
        yield from zip(self.source, self.labels, strict=False)


def test_graphs_the_steps_cannot_run_in_are_refused(tmp_path: Path) -> None:
    holder = IterableWrapper(["a"]).on_disk_cache()
    with pytest.raises(GraphError, match="read only through the end_caching"):
        list(holder)
    with pytest.raises(GraphError, match="found no on_disk_cache"):
        IterableWrapper(["a"]).map(str).end_caching()
    for steps, why in (
        (holder.batch(2), "keeps items between items"),
        (holder.shuffle(), "draws random numbers"),
        (holder.sharding_filter(), "splits items between workers"),
        (holder.zip(IterableWrapper([1])), "keeps items between items"),
        (WithLabels(holder, IterableWrapper([1])), "IterableWrapper.* is a source"),
    ):
        with pytest.raises(GraphError, match=why):
            steps.end_caching()
    with pytest.raises(ValueError, match="exclude each other"):
        holder.end_caching(filepath_fn=str, same_filepath_fn=True)
    with pytest.raises(ValueError, match="timeout"):
        holder.end_caching(timeout=0)
    with pytest.raises(ValueError, match="hash_type"):
        IterableWrapper(["a"]).on_disk_cache(hash_dict={}, hash_type="sha1")
    with pytest.raises(ValueError, match="mode"):
        holder.end_caching(mode="rb")
