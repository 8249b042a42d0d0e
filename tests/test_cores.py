"""`grade --jobs N`'s share of the cores (autograder/cores.py): torch threads per job, and
each running job pinned to CPUs of its own. The sandbox keeping a kernel on them is tested in
tests/test_sandbox.py, the whole batch (a submission that tries to hog the CPUs) in
tests/test_tamper.py."""
from __future__ import annotations

import os
import sys
import threading
from pathlib import Path

import pytest

from autograder import cores, jobs, processes


def fake_topology(root: Path, siblings: dict[int, str]) -> Path:
    for cpu, text in siblings.items():
        d = root / f"cpu{cpu}" / "topology"
        d.mkdir(parents=True)
        (d / "thread_siblings_list").write_text(text + "\n")
    return root


def test_share_of_cores(monkeypatch):
    for name in cores.THREAD_ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(cores.os, "sched_getaffinity", lambda pid: set(range(4)))
    assert cores.share_of_cores(1) == {}
    assert cores.share_of_cores(2) == dict.fromkeys(cores.THREAD_ENV, "2")
    assert cores.share_of_cores(8) == dict.fromkeys(cores.THREAD_ENV, "1")
    monkeypatch.setenv("OMP_NUM_THREADS", "3")                  # the instructor's choice wins
    assert cores.share_of_cores(2) == {"TORCHINDUCTOR_COMPILE_THREADS": "2"}


def test_physical_cores_keep_hyperthread_siblings_together(tmp_path):
    sys_cpu = fake_topology(tmp_path, {0: "0,4", 1: "1,5", 2: "2-3", 3: "2-3", 4: "0,4",
                                       5: "1,5"})
    assert cores.physical_cores(range(6), sys_cpu) == [[0, 4], [1, 5], [2, 3]]
    # only the CPUs this process may use count, even when a sibling is outside them
    assert cores.physical_cores({0, 1, 2, 4}, sys_cpu) == [[0, 4], [1], [2]]
    # no topology to read (a container without /sys): every CPU is a core of its own
    assert cores.physical_cores({3, 7}, tmp_path / "missing") == [[3], [7]]
    assert cores.physical_cores() == cores.physical_cores(os.sched_getaffinity(0))


def test_slots_are_disjoint_whole_cores_of_equal_size():
    four = [[0, 4], [1, 5], [2, 6], [3, 7]]
    two = cores.CoreSlots(2, four)
    assert two.sets == [[0, 1, 4, 5], [2, 3, 6, 7]] and two.disjoint
    three = cores.CoreSlots(3, four)                   # one core left idle: equal shares
    assert three.sets == [[0, 4], [1, 5], [2, 6]] and three.disjoint
    crowded = cores.CoreSlots(3, [[0], [1]])           # more jobs than cores
    assert crowded.sets == [[0], [1], [0]] and not crowded.disjoint
    assert crowded.describe() == "{0}, {1}, {0}"
    with pytest.raises(ValueError, match="workers must be >= 1"):
        cores.CoreSlots(0, four)


def test_take_lends_each_set_to_one_job_at_a_time():
    slots = cores.CoreSlots(2, [[0], [1]])
    got, second_done = [], threading.Event()
    with slots.take() as a, slots.take() as b:
        assert sorted([a, b]) == [[0], [1]]

        def third():
            with slots.take() as c:
                got.append(c)
            second_done.set()
        t = threading.Thread(target=third, daemon=True)
        t.start()
        t.join(0.3)
        assert not got, "a third job got CPUs while both sets were lent"
    assert second_done.wait(5) and got[0] in ([0], [1])


def test_run_logged_pins_the_child(tmp_path):
    cpu = min(os.sched_getaffinity(0))
    r = processes.run_logged([sys.executable, "-c",
                              "import os; print(sorted(os.sched_getaffinity(0)))"],
                             cwd=tmp_path, timeout=60, cpus=[cpu])
    assert r.returncode == 0 and r.output.strip() == f"[{cpu}]", r.output


def test_each_running_job_gets_a_set_of_its_own(monkeypatch):
    seen = []

    def fake_execute(job):
        seen.append(job["limits"]["cpus"])
        return {"ok": True}
    monkeypatch.setattr(jobs, "execute_job", fake_execute)
    run = jobs.execute_on_own_cores(cores.CoreSlots(2, [[0], [1]]))
    job = {"student": "s", "limits": {"notebook_timeout": 10}}
    assert run(job) == {"ok": True} and seen == [[0]]
    assert "cpus" not in job["limits"], "the batch's own job dict was changed"


@pytest.mark.parametrize("env, expected", [({"OMP_NUM_THREADS": "3", cores.CORES_ENV: "2"}, 3),
                                           ({cores.CORES_ENV: "2"}, 2), ({}, None),
                                           ({"OMP_NUM_THREADS": "4,2", cores.CORES_ENV: "1"}, 1)])
def test_restore_torch_threads_follows_the_setting_then_the_cores(monkeypatch, env, expected):
    import torch
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv(cores.CORES_ENV, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    before = torch.get_num_threads()
    try:
        n = cores.restore_torch_threads()
        assert n == torch.get_num_threads() == (expected or len(cores.physical_cores()))
    finally:
        torch.set_num_threads(before)
