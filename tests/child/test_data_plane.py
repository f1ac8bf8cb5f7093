"""The shared-memory data plane, end to end with real children: negotiated, reused, never leaked."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import weakref
from pathlib import Path

import httpx
import numpy as np
import psutil
import pytest

from child_runtime.protocol import wire
from child_runtime.protocol.shared_segment import (
    SEGMENT_NAME,
    ChildSegment,
    SharedSegmentUnavailable,
)
from supervisor import LocalRewardBackend, RewardItem, RewardRequest
from supervisor.child.segment import ParentSegment, SharedArena, _close_fds
from supervisor.errors import ScorerProcessDied, ScorerRequestError
from tests.conftest import REPO_ROOT, run_in_threads, wait_in_flight, wait_until_gone

FIXTURES = "tests.helpers.fixture_scorers"


def segment_fds(pid: int | str = "self") -> set[int]:
    """The data-plane memfds `pid` holds open, by inode (mmap keeps a dup of the descriptor)."""
    found = set()
    base = Path(f"/proc/{pid}/fd")
    for name in os.listdir(base):
        try:
            if os.readlink(base / name).startswith(f"/memfd:{SEGMENT_NAME}"):
                found.add(os.stat(base / name).st_ino)
        except OSError:
            continue
    return found


def holders_of_segments() -> list[int]:
    """Every process of ours that holds a segment open or mapped."""
    holders = []
    for proc in psutil.process_iter(["pid", "uids"]):
        if proc.info["uids"] is None or proc.info["uids"].real != os.getuid():
            continue
        try:
            maps = Path(f"/proc/{proc.pid}/maps").read_text()
            if segment_fds(proc.pid) or SEGMENT_NAME in maps:
                holders.append(proc.pid)
        except (OSError, psutil.Error):
            continue
    return holders


def shm_entries() -> set[str]:
    return set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()


def images(shapes: list[tuple[int, int, int]], seed: int = 0) -> RewardRequest:
    rng = np.random.default_rng(seed)
    return RewardRequest(
        items=[
            RewardItem(id=f"img{i}", image=rng.integers(0, 256, shape, dtype=np.uint8))
            for i, shape in enumerate(shapes)
        ]
    )


def exact_means(request: RewardRequest) -> list[float]:
    return [float(item.image.mean(dtype=np.float64)) / 255.0 for item in request.items]


def test_negotiated_at_start_and_scores_match_in_process(managed, image_python):
    backend = managed(image_python, "mean_intensity", "image")
    assert backend.ready_info["shared_memory"] is True
    assert backend.ready_info["event_loop"] == "uvloop"  # the env has it, so the child must use it
    request = images([(256, 256, 3)] * 8)
    frame = wire.prepare({"items": [item.to_wire() for item in request.items]})
    assert backend._gen.client.uses_segment(frame)
    with LocalRewardBackend("mean_intensity") as local:
        assert backend.compute_rewards(request).rewards == local.compute_rewards(request).rewards
    assert len(segment_fds()) == 1


def test_extents_are_reused_and_never_serve_stale_bytes(managed, image_python):
    backend = managed(
        image_python, "mean_intensity", "image", client={"shared_memory_min_bytes": 0}
    )
    segment = backend._gen.segment
    for seed, side in enumerate([8, 64, 512, 64, 700, 8]):
        request = images([(side, side, 3), (side // 2 + 1, side, 4)], seed=seed)
        assert backend.compute_rewards(request).rewards == exact_means(request)
        # each request's extents are freed after its answer
        assert segment.free_bytes == segment.capacity
    assert backend._gen.segment is segment  # one segment for the child's life
    assert segment.copied_bytes > 0 and segment.in_place_bytes == 0


def test_in_band_when_the_parent_offers_no_segment(managed, image_python):
    backend = managed(
        image_python, "mean_intensity", "image", client={"shared_memory_min_bytes": None}
    )
    assert backend.ready_info["shared_memory"] is False
    assert backend.ready_info["shared_memory_error"] == "not offered by the parent"
    assert segment_fds() == set()
    request = images([(300, 200, 3)] * 3)
    assert backend.compute_rewards(request).rewards == exact_means(request)


class _UnsealedSegment(ParentSegment):
    """Hands the child an unsealed memfd, which it must refuse: a shrink could make a read
    SIGBUS."""

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        os.close(self.child_fd)
        self.child_fd = os.memfd_create(SEGMENT_NAME, os.MFD_CLOEXEC)
        self._fd_closer.detach()
        self._fd_closer = weakref.finalize(self, _close_fds, self.fd, self.child_fd)


def test_a_child_that_refuses_the_segment_is_served_in_band(managed, image_python, monkeypatch):
    monkeypatch.setattr("supervisor.backends.managed.ParentSegment", _UnsealedSegment)
    backend = managed(image_python, "mean_intensity", "image")
    assert backend.ready_info["shared_memory"] is False
    assert "not sealed against shrinking" in backend.ready_info["shared_memory_error"]
    assert segment_fds() == set()  # the refused segment was closed at once
    request = images([(256, 256, 3)] * 4)
    assert backend.compute_rewards(request).rewards == exact_means(request)


@pytest.mark.parametrize("min_bytes, backing", [(0, "mmap"), (None, "bytes")])
def test_the_scorer_gets_read_only_zero_copy_views(managed, image_python, min_bytes, backing):
    backend = managed(
        image_python,
        f"{FIXTURES}:InputProbe",
        "image",
        client={"shared_memory_min_bytes": min_bytes},
    )
    values = backend.compute_rewards(images([(64, 64, 3)] * 3)).diagnostics["input_probe"]["values"]
    assert values["writeable"] == 0
    assert values[f"{backing}_backed"] == 3


def test_a_scorer_that_writes_its_inputs_gets_private_copies(managed, image_python):
    request = images([(64, 64, 3)] * 2)
    before = [item.image.copy() for item in request.items]
    backend = managed(
        image_python, f"{FIXTURES}:WritesInputs", "image", client={"shared_memory_min_bytes": 0}
    )
    with LocalRewardBackend(f"{FIXTURES}:WritesInputs") as local:
        for scored in (backend.compute_rewards(request), local.compute_rewards(request)):
            assert scored.rewards == [0.0, 0.0]
            assert scored.diagnostics["writes_inputs"]["values"]["writeable"] == 2
    assert all(
        np.array_equal(item.image, old) for item, old in zip(request.items, before, strict=True)
    )


def test_a_scorer_writing_into_read_only_inputs_fails_loudly(managed, image_python):
    request = images([(64, 64, 3)])
    backend = managed(
        image_python,
        f"{FIXTURES}:WritesWithoutSaying",
        "image",
        client={"shared_memory_min_bytes": 0},
    )
    with pytest.raises(ScorerRequestError, match="read-only") as caught:
        backend.compute_rewards(request)
    assert caught.value.status == 500
    assert backend.health()["state"] == "ready"
    with LocalRewardBackend(f"{FIXTURES}:WritesWithoutSaying") as local:
        with pytest.raises(ScorerRequestError, match="read-only") as in_process:
            local.compute_rewards(request)  # in-process too: the trainer's arrays are never written
    assert isinstance(in_process.value.__cause__, ValueError)


def _shared_frame(descs: list[dict], trailing: bytes = b"") -> bytes:
    header = wire.json.dumps(
        {
            "meta": {"items": [{"id": "a", "image": {"__array__": 0}}]},
            "arrays": descs,
            "shared": True,
        }
    ).encode()
    return wire.MAGIC + wire._LEN.pack(len(header)) + header + trailing


@pytest.mark.parametrize(
    "case, descs, trailing, message",
    [
        (
            "past the request limit",
            [{"dtype": "|u1", "shape": [4096, 4096, 3], "offset": 0, "nbytes": 48 << 20}],
            b"",
            "limit max_request_bytes",
        ),
        (
            "trailing bytes",
            [{"dtype": "|u1", "shape": [2, 2, 3], "offset": 0, "nbytes": 12}],
            b"junk",
            "bytes past its header",
        ),
    ],
)
def test_hostile_shared_frames_are_refused(managed, image_python, case, descs, trailing, message):
    backend = managed(
        image_python, "mean_intensity", "image", limits={"max_request_bytes": 32 << 20}
    )
    child = backend._gen.child
    with httpx.Client(
        base_url=f"http://127.0.0.1:{child.port}",
        trust_env=False,
        timeout=10,
        headers={"authorization": f"Bearer {child.token}"},
    ) as http:
        response = http.post("/score", content=_shared_frame(descs, trailing))
    assert response.status_code == 400, case
    assert message in response.json()["error"]
    request = images([(32, 32, 3)])
    assert backend.compute_rewards(request).rewards == exact_means(request)


def test_a_shared_frame_to_a_child_without_a_segment_is_refused(managed, image_python):
    backend = managed(
        image_python, "mean_intensity", "image", client={"shared_memory_min_bytes": None}
    )
    child = backend._gen.child
    frame = _shared_frame([{"dtype": "|u1", "shape": [2, 2, 3], "offset": 0, "nbytes": 12}])
    response = httpx.post(
        f"http://127.0.0.1:{child.port}/score",
        content=frame,
        trust_env=False,
        timeout=10,
        headers={"authorization": f"Bearer {child.token}"},
    )
    assert response.status_code == 400
    assert "none was negotiated" in response.json()["error"]


def test_a_restart_gets_a_fresh_segment_and_closes_the_old_one(managed, image_python):
    shm_before = shm_entries()
    backend = managed(image_python, "mean_intensity", "image", restart={"backoff_s": 0.0})
    request = images([(128, 128, 3)] * 4)
    backend.compute_rewards(request)
    old_segment, old_pid = backend._gen.segment, backend.pid
    os.kill(old_pid, signal.SIGKILL)
    with pytest.raises(ScorerProcessDied):
        backend.compute_rewards(request)
    assert backend.compute_rewards(request).rewards == exact_means(request)
    assert backend.pid != old_pid and backend._gen.segment is not old_segment
    assert old_segment.fd == -1 and len(segment_fds()) == 1
    backend.close()
    assert segment_fds() == set()
    assert shm_entries() == shm_before


PARENT_SCRIPT = """
import sys, time
import numpy as np
from supervisor import ManagedScorerProcessBackend, RewardItem, RewardRequest

backend = ManagedScorerProcessBackend(
    {
        "process": {"python_executable": sys.argv[1]},
        "scorer": {"name": "mean_intensity", "input_kind": "image"},
        "client": {"input_kind": "image"},
    }
)
image = np.full((256, 256, 3), 51, np.uint8)
print(
    backend.compute_rewards(RewardRequest(items=[RewardItem(id="a", image=image)])).rewards[0],
    backend.pid,
    flush=True,
)
time.sleep(600)
"""


def test_a_killed_trainer_leaves_no_segment_anywhere(image_python):
    """kill -9 of the parent: the child dies with it, and with both gone the kernel frees the
    memfd."""
    shm_before = shm_entries()
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT_SCRIPT, str(image_python)],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        reward, child_pid = parent.stdout.readline().split()
        assert float(reward) == pytest.approx(0.2)
        assert {parent.pid, int(child_pid)} <= set(holders_of_segments())
        parent.kill()
        parent.wait(10)
        assert wait_until_gone([int(child_pid)], 5.0) == []
        assert not set(holders_of_segments()) & {parent.pid, int(child_pid), os.getpid()}
        assert shm_entries() == shm_before
    finally:
        parent.kill()
        parent.wait(10)
        parent.stdout.close()


def test_the_child_gets_a_read_only_descriptor_it_cannot_reseal_or_resize():
    segment = ParentSegment(1 << 20)
    try:
        offset = segment.allocate(10_000)
        segment.array(offset, (3,), np.uint8)[:] = np.frombuffer(b"abc", np.uint8)
        # the extent's pages are reserved: no SIGBUS later
        assert os.fstat(segment.fd).st_blocks * 512 >= 10_000
        with pytest.raises(PermissionError):
            import fcntl

            fcntl.fcntl(segment.child_fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_GROW)
        with pytest.raises(OSError):
            os.ftruncate(segment.child_fd, 1 << 30)
        child = ChildSegment(os.dup(segment.child_fd), 1 << 20)
        try:
            assert bytes(child.view(3)[offset : offset + 3]) == b"abc"
            with pytest.raises(wire.WireError, match="limit max_request_bytes"):
                child.view(segment.capacity + 1)
        finally:
            child.close()
    finally:
        segment.close()
    segment.close()  # idempotent
    with pytest.raises(ValueError, match="closed"):
        segment.allocate(10)


def test_a_forked_process_does_not_pin_the_segment():
    """A DataLoader-style fork of the trainer drops its copies of every segment at once."""
    segment = ParentSegment(1 << 20)
    try:
        segment.array(segment.allocate(4096), (1,), np.uint8)[0] = 7
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:  # the forked child: report what it holds, then leave without cleanup
            os.close(read_end)
            held = len(segment_fds()) + (SEGMENT_NAME in Path("/proc/self/maps").read_text())
            os.write(write_end, str(held).encode())
            os._exit(0)
        os.close(write_end)
        try:
            assert os.read(read_end, 16) == b"0"
        finally:
            os.close(read_end)
            os.waitpid(pid, 0)
        assert segment.fd >= 0  # the parent's own segment is untouched
    finally:
        segment.close()


def test_the_allocator_carves_aligned_extents_and_coalesces_them():
    segment = ParentSegment(4096 + 10)
    try:
        assert segment.capacity == 4096  # whole 64-byte blocks, inside the limit
        a, b, c = (segment.allocate(n, arena=True) for n in (1, 100, 64))
        assert (a, b, c) == (0, 64, 192)  # arenas from the bottom
        copy = segment.allocate(100)
        assert copy == 4096 - 128  # a request's copies from the top
        assert segment.free_bytes == 4096 - 256 - 128
        with pytest.raises(MemoryError):
            segment.allocate(4096)
        segment.release_arena(b)
        assert segment.allocate(128, arena=True) == 64  # first fit reuses the hole
        segment.release(copy, 100)
        for offset in (a, 64, c):
            segment.release_arena(offset)
        # coalesced back into one extent
        assert segment.free_bytes == 4096 and segment.allocate(4096) == 0
    finally:
        segment.close()


def test_locate_finds_arena_arrays_only_when_the_wire_can_name_them():
    segment = ParentSegment(1 << 20)
    try:
        with SharedArena(segment) as arena:
            batch = arena.empty((4, 64, 64, 3))
            assert batch.flags.writeable and segment.locate(batch) == 0
            assert segment.locate(batch[1]) == 64 * 64 * 3  # a whole image of the batch: in place
            assert segment.locate(batch[:, :, :, 0]) is None  # not contiguous: copied
            assert segment.locate(batch.reshape(-1)[1:65]) is None  # not 64-byte aligned: copied
            assert segment.locate(np.zeros(10, np.uint8)) is None  # the trainer's own heap
        assert segment.free_bytes == segment.capacity
    finally:
        segment.close()


def test_arena_arrays_are_scored_in_place_and_freed_with_the_arena(managed, image_python):
    backend = managed(image_python, "mean_intensity", "image")
    segment = backend._gen.segment
    heap = np.random.default_rng(5).integers(0, 256, (100, 100, 3), dtype=np.uint8)
    with backend.arena() as arena:
        batch = arena.empty((4, 256, 256, 3))
        for i in range(4):
            batch[i] = i * 60
        request = RewardRequest(
            items=[RewardItem(id=f"a{i}", image=batch[i]) for i in range(4)]
            + [RewardItem(id="heap", image=heap)]
        )
        for _ in range(3):  # the arrays stay valid across requests while the arena is open
            assert backend.compute_rewards(request).rewards == exact_means(request)
        assert (
            segment.in_place_bytes == 3 * batch.nbytes and segment.copied_bytes == 3 * heap.nbytes
        )
    assert segment.free_bytes == segment.capacity
    with LocalRewardBackend("mean_intensity") as local, local.arena() as heap_arena:
        plain = heap_arena.empty((8, 8, 3))  # same trainer code, ordinary memory
        plain[...] = 255
        assert local.compute_rewards(
            RewardRequest(items=[RewardItem(id="p", image=plain)])
        ).rewards == [1.0]


def test_a_full_segment_sends_in_band_and_a_restart_copies_old_arena_arrays(managed, image_python):
    backend = managed(
        image_python,
        "mean_intensity",
        "image",
        restart={"backoff_s": 0.0},
        limits={"max_request_bytes": 1 << 20},
    )
    with backend.arena() as arena:
        hog = arena.empty((1 << 20) - 64)  # leaves one 64-byte extent
        small = images([(128, 128, 3)] * 2)
        assert backend.compute_rewards(small).rewards == exact_means(small)  # in-band: no room
        assert backend._gen.segment.copied_bytes == 0
        arena.close()
        kept = arena.empty((256, 256, 3))  # over shared_memory_min_bytes
        kept[...] = 51
        os.kill(backend.pid, signal.SIGKILL)
        with pytest.raises(ScorerProcessDied):
            backend.compute_rewards(small)
        request = RewardRequest(items=[RewardItem(id="k", image=kept)])
        # the new child's segment copies it
        assert backend.compute_rewards(request).rewards == [0.2]
        assert backend._gen.segment.copied_bytes == kept.nbytes
    del hog


def test_concurrent_requests_and_arenas_share_the_segment_safely(managed, image_python):
    backend = managed(image_python, "mean_intensity", "image")
    failures: list[str] = []

    def worker(seed: int) -> None:
        rng = np.random.default_rng(seed)
        for _ in range(10):
            with backend.arena() as arena:
                image = arena.empty((64, 96, 3))
                image[...] = rng.integers(0, 256, image.shape, dtype=np.uint8)
                request = RewardRequest(
                    items=[RewardItem(id="x", image=image)]
                    + list(images([(200, 200, 3)], seed=seed).items)
                )
                got = backend.compute_rewards(request).rewards
                if got != exact_means(request):
                    failures.append(f"worker {seed}: {got} != {exact_means(request)}")

    run_in_threads(worker, 4)
    assert failures == [] and backend._gen.segment.free_bytes == backend._gen.segment.capacity


def test_a_stale_arena_array_is_copied_never_overwritten_by_its_own_request(managed, image_python):
    """Use after close is a bug, but it must not corrupt a neighbour: request copies come from the
    top."""
    backend = managed(image_python, "mean_intensity", "image")
    with backend.arena() as arena:
        stale = arena.empty((256, 256, 3))
        stale[...] = 0
    white = np.full((256, 256, 3), 255, np.uint8)
    request = RewardRequest(
        items=[RewardItem(id="white", image=white), RewardItem(id="stale", image=stale)]
    )
    assert backend._gen.segment.locate(stale) is None
    assert backend.compute_rewards(request).rewards == [1.0, 0.0]
    assert (stale == 0).all()


def test_an_arena_closed_during_its_request_keeps_its_extent_until_the_answer(
    managed, image_python
):
    backend = managed(image_python, f"{FIXTURES}:InputProbe", "image", params={"sleep_s": 1.0})
    results: list[list[float]] = []
    arena = backend.arena()
    black = arena.empty((4, 128, 128, 3))
    black[...] = 0
    request = RewardRequest(items=[RewardItem(id=f"b{i}", image=black[i]) for i in range(4)])
    worker = threading.Thread(
        target=lambda: results.append(backend.compute_rewards(request).rewards)
    )
    worker.start()
    try:
        wait_in_flight(backend)
        arena.close()  # a pipelined trainer moves on to the next step
        with backend.arena() as next_step:
            white = next_step.empty((4, 128, 128, 3))
            white[...] = 255
            assert not np.shares_memory(white, black)  # the pinned extent was not handed out again
    finally:
        worker.join(30)
    assert results == [[0.0] * 4]
    assert backend._gen.segment.free_bytes == backend._gen.segment.capacity  # freed once answered


def test_an_arena_outliving_its_child_falls_back_to_ordinary_memory(managed, image_python):
    backend = managed(image_python, "mean_intensity", "image", restart={"backoff_s": 0.0})
    with backend.arena() as arena:
        os.kill(backend.pid, signal.SIGKILL)
        with pytest.raises(ScorerProcessDied):
            backend.compute_rewards(images([(8, 8, 3)]))
        backend.compute_rewards(images([(8, 8, 3)]))  # restarted: the arena's segment is closed
        image = arena.empty((256, 256, 3))
        image[...] = 51
        assert arena.heap_fallbacks == 1
        assert backend.compute_rewards(
            RewardRequest(items=[RewardItem(id="a", image=image)])
        ).rewards == [0.2]


def test_no_pages_for_an_extent_means_in_band_not_a_dead_child(managed, image_python, monkeypatch):
    backend = managed(image_python, "mean_intensity", "image")
    pid = backend.pid

    def no_space(fd: int, offset: int, length: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", no_space)
    request = images([(256, 256, 3)] * 2)
    assert backend.compute_rewards(request).rewards == exact_means(request)
    assert backend.pid == pid and backend._gen.segment.copied_bytes == 0
    assert backend._gen.segment.free_bytes == backend._gen.segment.capacity


def test_an_interrupted_fallocate_returns_its_extent(monkeypatch):
    segment = ParentSegment(1 << 20)
    try:

        def interrupted(fd: int, offset: int, length: int) -> None:
            raise KeyboardInterrupt

        monkeypatch.setattr(os, "posix_fallocate", interrupted)
        with pytest.raises(KeyboardInterrupt):
            segment.allocate(4096)
        assert segment.free_bytes == segment.capacity
    finally:
        segment.close()


def test_a_segment_too_small_to_map_means_in_band(managed, image_python):
    backend = managed(image_python, "mean_intensity", "image", limits={"max_request_bytes": 1000})
    assert backend.ready_info["shared_memory"] is False and backend._gen.segment is None
    request = images([(8, 8, 3)])
    assert backend.compute_rewards(request).rewards == exact_means(request)
    with pytest.raises(SharedSegmentUnavailable, match="too small"):
        ParentSegment(100)


def test_a_fork_while_another_thread_holds_the_segment_lock_does_not_hang():
    segment = ParentSegment(1 << 20)
    try:
        with segment._lock:  # as if another thread were allocating at the moment of the fork
            pid = os.fork()
            if pid == 0:
                os._exit(0 if segment.fd == -1 else 1)
        deadline = time.monotonic() + 10
        while (done := os.waitpid(pid, os.WNOHANG)) == (0, 0):
            assert time.monotonic() < deadline, "the forked child hung in the at-fork hook"
            time.sleep(0.01)
        assert os.waitstatus_to_exitcode(done[1]) == 0
    finally:
        segment.close()


def rss_shmem_bytes(pid: int | str = "self") -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("RssShmem:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no RssShmem in /proc/status")


def test_a_large_request_gives_its_shared_memory_back(managed, image_python):
    """One 192 MB request must not pin 192 MB of shared memory in both processes for the child's
    life: freed extents beyond a small warm reserve give their pages back."""
    backend = managed(image_python, "mean_intensity", input_kind="image")
    small = RewardRequest(
        items=[RewardItem(id=f"s{i}", image=np.full((512, 512, 3), i, np.uint8)) for i in range(8)]
    )
    backend.compute_rewards(small)  # the steady state: a typical batch, its pages kept warm
    before = rss_shmem_bytes(), rss_shmem_bytes(backend.pid)
    large = RewardRequest(
        items=[
            RewardItem(id=f"l{i}", image=np.full((4000, 4000, 3), 200, np.uint8)) for i in range(4)
        ]
    )
    assert backend.compute_rewards(large).rewards == pytest.approx([200 / 255] * 4)
    after = rss_shmem_bytes(), rss_shmem_bytes(backend.pid)
    segment = backend._gen.segment
    assert segment.returned_bytes >= 192_000_000 - segment.warm_reserve - (1 << 20)
    assert segment.backed_bytes <= segment.warm_reserve + (1 << 20)
    for side, (was, now) in zip(("trainer", "child"), zip(before, after, strict=True), strict=True):
        assert now - was < 4 << 20, f"{side}: RssShmem {was >> 20} MiB -> {now >> 20} MiB"
    # still correct
    assert backend.compute_rewards(small).rewards == pytest.approx([i / 255 for i in range(8)])


def test_the_warm_reserve_keeps_steady_batches_from_faulting_fresh_pages():
    segment = ParentSegment(64 << 20)
    try:
        for _ in range(3):
            with segment.placement() as place:
                place(np.ones((512, 512, 3), np.uint8))
        assert segment.returned_bytes == 0 and 0 < segment.backed_bytes <= (1 << 20)
        with segment.placement() as place:
            place(np.ones(40 << 20, np.uint8))
        assert segment.backed_bytes <= segment.warm_reserve + 4096
        assert segment.returned_bytes >= (40 << 20) - segment.warm_reserve - 4096
        with segment.placement() as place:  # a hole punched earlier is backed again when reused
            offset = place(np.full(20 << 20, 9, np.uint8))
            assert int(segment._bytes[offset + (10 << 20)]) == 9
    finally:
        segment.close()


def _reopen_writable(fd: int, as_other_user: bool) -> str:
    """Try to reopen `fd` read-write through /proc, as a process of another (non-root) uid when
    root: root bypasses file modes, and the point is what an ordinary same-user process can do."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(read_end)
            if as_other_user:
                import ctypes

                os.setgroups([])
                os.setgid(65534)
                os.setuid(65534)
                # PR_SET_DUMPABLE: /proc/self stays ours after setuid
                ctypes.CDLL(None).prctl(4, 1, 0, 0, 0)
            try:
                os.close(os.open(f"/proc/self/fd/{fd}", os.O_RDWR))
                outcome = "opened"
            except PermissionError:
                outcome = "refused"
            os.write(write_end, outcome.encode())
        finally:
            os._exit(0)
    os.close(write_end)
    try:
        return os.read(read_end, 64).decode()
    finally:
        os.close(read_end)
        os.waitpid(pid, 0)


def test_the_segment_cannot_be_reopened_writable_through_proc():
    segment = ParentSegment(1 << 20)
    try:
        assert os.fstat(segment.fd).st_mode & 0o777 == 0o400
        spare = os.dup(segment.child_fd)  # the at-fork hook closes the segment's own descriptors
        try:
            assert _reopen_writable(spare, as_other_user=os.geteuid() == 0) == "refused"
        finally:
            os.close(spare)
    finally:
        segment.close()


def test_the_child_holds_the_segment_read_only_and_cannot_reopen_it_writable(managed, image_python):
    backend = managed(image_python, "mean_intensity", input_kind="image")
    assert backend.ready_info["shared_memory"] is True
    (fd,) = [
        name
        for name in os.listdir(f"/proc/{backend.pid}/fd")
        if os.readlink(f"/proc/{backend.pid}/fd/{name}").startswith(f"/memfd:{SEGMENT_NAME}")
    ]
    flags = int(
        Path(f"/proc/{backend.pid}/fdinfo/{fd}").read_text().split("flags:")[1].split()[0], 8
    )
    assert flags & os.O_ACCMODE == os.O_RDONLY  # one descriptor (the mapping's own), read-only
    assert os.stat(f"/proc/{backend.pid}/fd/{fd}").st_mode & 0o777 == 0o400  # no writable reopen
    maps = [
        line
        for line in Path(f"/proc/{backend.pid}/maps").read_text().splitlines()
        if SEGMENT_NAME in line
    ]
    assert maps and all(line.split()[1].startswith("r-") for line in maps)
    image = np.full((512, 512, 3), 51, np.uint8)
    assert backend.compute_rewards(
        RewardRequest(items=[RewardItem(id="a", image=image)])
    ).rewards == [0.2]
