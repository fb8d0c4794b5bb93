"""The runtime shim under faults, with real processes (CPU, gloo, loopback only, bounded timeouts).

(a) a rank that raises mid-training takes the whole torchrun job down (non-zero, no hang);
(b) a MASTER_PORT somebody else holds: a world of one without torchrun needs no rendezvous and
    runs; a launcher-style world binds the port and fails fast, naming the port;
(c) two torchrun "nodes" on one machine (c10d rendezvous on 127.0.0.1) train a migrated scenario to
    the same weights as one node with two processes;
(d) the plain-``python`` fallback listens on loopback only while it trains.
"""

from __future__ import annotations

import os
import select
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from e2e_support import SCENARIOS, assert_same_weights, clean_env, free_port, load_state, migrate

pytestmark = pytest.mark.e2e

FAULTS = Path(__file__).parent / "scripts" / "faults"
TRAIN = FAULTS / "train_fault.py"
LOOPBACK = {"127.0.0.1", "::1", "::ffff:127.0.0.1"}
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]


def _env(**extra) -> dict:
    # loopback only: gloo pairs on lo, and a short init timeout so that no failure can hang for the
    # default 30 minutes
    return clean_env({"GLOO_SOCKET_IFNAME": "lo", "DISTIFY_INIT_TIMEOUT": "60", **extra})


def _communicate(proc: subprocess.Popen, timeout: float) -> tuple:
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        out, err = proc.communicate()
        pytest.fail(f"no exit within {timeout}s (hang)\n--- stdout ---\n{out[-3000:]}\n--- stderr ---\n{err[-3000:]}")
    return out, err


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, 9)
    except (ProcessLookupError, PermissionError):
        pass


def _popen(argv, cwd, env) -> subprocess.Popen:
    return subprocess.Popen(
        [str(a) for a in argv], cwd=str(cwd), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, start_new_session=True,  # its own process group: a hang is killed whole
    )


# --------------------------------------------------------------------------- (a) a rank raises


def test_a_rank_that_raises_ends_the_whole_job(tmp_path):
    start = time.monotonic()
    proc = _popen(
        [*TORCHRUN, "--standalone", "--nproc-per-node", "2", TRAIN, "--fail-rank", "1", "--fail-step", "3",
         "--steps", "100000"],
        tmp_path, _env(),
    )
    out, err = _communicate(proc, timeout=60)
    elapsed = time.monotonic() - start
    assert proc.returncode != 0, out + err
    assert "injected failure on rank 1" in err or "rank      : 1" in err, err[-3000:]
    assert "finished" not in out  # rank 0 did not run on to the end alone
    assert elapsed < 60


# --------------------------------------------------------------------------- (b) port in use


@pytest.fixture(scope="module")
def port_runs(tmp_path_factory):
    """Three runs of the training script while this process listens on MASTER_PORT (127.0.0.1):

    b1: RANK=0 WORLD_SIZE=1 by hand, no torchrun: a world of one needs no rendezvous -- the shim
        uses an in-memory store and never touches MASTER_PORT, so the held port does not matter;
    b2: the same plus LOCAL_RANK (torch.distributed.launch --use-env style, read as torchrun):
        env:// makes rank 0 serve the store on MASTER_PORT, which is taken;
    b3: a two-process world (Kubeflow style), rank 0 alone: the same bind failure, before any wait
        for the missing peer.
    """
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    port = sock.getsockname()[1]
    cwd = tmp_path_factory.mktemp("port")
    base = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "DISTIFY_INIT_TIMEOUT": "20"}
    cases = {
        "b1": {"RANK": "0", "WORLD_SIZE": "1"},
        "b2": {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"},
        "b3": {"RANK": "0", "WORLD_SIZE": "2"},
    }
    try:
        start = time.monotonic()
        procs = {k: _popen([sys.executable, TRAIN, "--steps", "2"], cwd, _env(**base, **v)) for k, v in cases.items()}
        results = {k: (p, *_communicate(p, timeout=60)) for k, p in procs.items()}
        elapsed = time.monotonic() - start
    finally:
        sock.close()
    return port, elapsed, {k: (p.returncode, out, err) for k, (p, out, err) in results.items()}


def test_b_port_in_use(port_runs):
    port, elapsed, results = port_runs
    assert elapsed < 60
    rc, out, err = results["b1"]
    assert rc == 0, err[-3000:]
    assert "rank 0 finished" in out
    for key in ("b2", "b3"):
        rc, out, err = results[key]
        assert rc != 0, f"{key}: ran although port {port} is taken\n{out}"
        last = err.strip().splitlines()[-1]
        # the shim's one line names the variable, the port and the problem
        assert "MASTER_PORT" in last and "in use" in last, f"{key}: {err[-3000:]}"
        assert str(port) in last, f"{key}: {last}"


def test_b_port_in_use_message_is_one_line(port_runs):
    _, _, results = port_runs
    for key in ("b2", "b3"):
        rc, out, err = results[key]
        assert rc != 0
        assert "Traceback" not in err, err
        assert err.strip().startswith("distify:") and "MASTER_PORT" in err, err


# --------------------------------------------------------------------------- (c) two nodes


def test_c_two_node_rendezvous_matches_one_node(tmp_path):
    script = tmp_path / "train.py"
    migrate(SCENARIOS / "module_level.in.py", script, backend="ddp")
    assert "init_process_group" in script.read_text()
    args = ["--batch-size", "16", "--epochs", "2", "--checkpoint", "final.pt"]
    port = free_port()
    dirs = {name: tmp_path / name for name in ("node0", "node1", "single")}
    for d in dirs.values():
        d.mkdir()
    procs = {
        f"node{r}": _popen(
            [*TORCHRUN, "--nnodes", "2", "--node-rank", str(r), "--nproc-per-node", "1",
             "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--local-addr", "127.0.0.1",
             "--rdzv-conf", "join_timeout=60", script, *args],
            dirs[f"node{r}"], _env(),
        )
        for r in (0, 1)
    }
    procs["single"] = _popen([*TORCHRUN, "--standalone", "--nproc-per-node", "2", script, *args], dirs["single"], _env())
    results = {k: (p, *_communicate(p, timeout=85)) for k, p in procs.items()}
    for k, (p, out, err) in results.items():
        assert p.returncode == 0, f"{k} exit {p.returncode}\n{out[-2000:]}\n{err[-3000:]}"
    # c10d assigns global ranks at rendezvous: global rank 0 (the only writer) may sit on either node
    written = [d for d in ("node0", "node1") if (dirs[d] / "final.pt").exists()]
    assert len(written) == 1, f"checkpoint written by {written}"
    multi = load_state(dirs[written[0]] / "final.pt")
    single = load_state(dirs["single"] / "final.pt")
    assert assert_same_weights(multi, single, atol=1e-5, label="2 nodes vs 1 node") < 1e-5
    assert not any(k.startswith("module.") for k in multi)


# --------------------------------------------------------------------------- (d) loopback only


def test_d_plain_python_fallback_listens_on_loopback_only(tmp_path):
    psutil = pytest.importorskip("psutil")
    hold = tmp_path / "stop"
    env = clean_env({"DISTIFY_INIT_TIMEOUT": "60"})  # no launcher variables, no GLOO_SOCKET_IFNAME
    env.pop("GLOO_SOCKET_IFNAME", None)
    env.pop("NCCL_SOCKET_IFNAME", None)
    proc = _popen([sys.executable, TRAIN, "--hold-file", hold], tmp_path, env)
    try:
        ready, _, _ = select.select([proc.stdout], [], [], 60)
        assert ready, "the script did not reach its training loop within 60 s"
        line = proc.stdout.readline()  # "TRAINING pid=... rank=0 world=1" once in the loop
        assert line.startswith("TRAINING"), line + (proc.stderr.read() if proc.poll() is not None else "")
        assert "world=1" in line
        time.sleep(0.5)  # a few all-reduced steps
        conns = psutil.Process(proc.pid).net_connections(kind="inet")
        listening = [c for c in conns if c.status == psutil.CONN_LISTEN]
        public = [c for c in listening if c.laddr and c.laddr.ip not in LOOPBACK]
        assert not public, f"listening beyond loopback: {public}"
        # nothing else (established pairs included) on a non-loopback address either
        assert not [c for c in conns if c.laddr and c.laddr.ip not in LOOPBACK], conns
        assert proc.poll() is None, "the script stopped training before the sockets were inspected"
    finally:
        hold.touch()
        out, err = _communicate(proc, timeout=60)
    assert proc.returncode == 0, err[-3000:]
