"""A warm launcher: ranks forked from a process that has imported torch once (tests only).

Started once per test session by tests/e2e_support.py. Reads one JSON request a line on stdin and
answers one JSON line on stdout. A request names a script, its arguments, folder, output files, base
environment, a timeout and a launcher whose contract with the script it reproduces:

- ``torchrun``: N ranks with the variables torchrun 2.13 gives its workers (RANK, LOCAL_RANK,
  WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_*, ROLE_*, MASTER_ADDR/PORT, TORCHELASTIC_*), except that rank 0
  hosts the TCP store itself (TORCHELASTIC_USE_AGENT_STORE=False) since there is no agent;
- ``horovodrun``: N ranks with the variables ``horovodrun --gloo`` gives them (HOROVOD_RANK/SIZE/...,
  the Gloo rendezvous address) and Horovod's own HTTP rendezvous server, started by the supervisor;
- ``python``: one process and no launcher variable, as ``python SCRIPT``.

What is not reproduced: the launcher process itself (elastic agent, restarts, its log lines, the
``[rank]<stdout>:`` prefixes of horovodrun) and the interpreter's own start-up and C++ teardown (see
forked_main.py). Tests of the launcher, or of what happens at interpreter exit, launch for real.

Like torchrun, when one rank fails the others are terminated; the answer is
``{"returncode": first failing rank's status or 0, "detail": "..."}``, and a rank still running
at the timeout is killed (``"timeout": true``).
"""
from __future__ import annotations

import json
import os
import signal
import socket
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from forked_main import run_as_main  # noqa: E402


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _torchrun_env(base: dict, rank: int, nproc: int, port: int, run_id: str) -> dict:
    return {
        **base, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(nproc),
        "LOCAL_WORLD_SIZE": str(nproc), "GROUP_RANK": "0", "GROUP_WORLD_SIZE": "1", "ROLE_NAME": "default",
        "ROLE_RANK": str(rank), "ROLE_WORLD_SIZE": str(nproc), "MASTER_ADDR": "localhost",
        "MASTER_PORT": str(port), "TORCHELASTIC_RUN_ID": run_id, "TORCHELASTIC_RESTART_COUNT": "0",
        "TORCHELASTIC_MAX_RESTARTS": "0", "TORCHELASTIC_USE_AGENT_STORE": "False",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
    }


def _horovod_env(base: dict, rank: int, nproc: int, port: int) -> dict:
    return {
        **base, "HOROVOD_CONTROLLER": "gloo", "HOROVOD_CPU_OPERATIONS": "gloo", "HOROVOD_GLOO_IFACE": "lo",
        "NCCL_SOCKET_IFNAME": "lo", "HOROVOD_GLOO_RENDEZVOUS_ADDR": "127.0.0.1",
        "HOROVOD_GLOO_RENDEZVOUS_PORT": str(port), "HOROVOD_HOSTNAME": "localhost", "HOROVOD_RANK": str(rank),
        "HOROVOD_SIZE": str(nproc), "HOROVOD_LOCAL_RANK": str(rank), "HOROVOD_LOCAL_SIZE": str(nproc),
        "HOROVOD_CROSS_RANK": "0", "HOROVOD_CROSS_SIZE": "1",
    }


def _kill_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _supervise(request: dict, answer_fd: int) -> None:
    """In a child of the server: start the ranks, wait for them, write the answer, exit."""
    launcher, nproc = request["launcher"], int(request.get("nproc", 1))
    base = request["env"]
    rendezvous = None
    if launcher == "torchrun":
        port, run_id = _free_port(), f"warm-{os.getpid()}"
        envs = [_torchrun_env(base, r, nproc, port, run_id) for r in range(nproc)]
    elif launcher == "horovodrun":
        from horovod.runner.common.util.hosts import get_host_assignments, parse_hosts
        from horovod.runner.http.http_server import RendezvousServer

        rendezvous = RendezvousServer(0)
        port = rendezvous.start()
        rendezvous.init(get_host_assignments(parse_hosts(f"localhost:{nproc}"), nproc))
        envs = [_horovod_env(base, r, nproc, port) for r in range(nproc)]
    else:
        envs = [dict(base)]
    ranks = {}
    for rank, env in enumerate(envs):
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            os.setpgid(0, 0)
            os.close(answer_fd)
            run_as_main(request["script"], request.get("args", ()), request["cwd"], request["stdout"],
                        request["stderr"], env)
        ranks[pid] = rank
    deadline = time.monotonic() + float(request.get("timeout", 180))
    codes, failed, timed_out = {}, None, False
    while len(codes) < len(ranks):
        pid, status = os.waitpid(-1, os.WNOHANG)
        if pid in ranks:
            codes[ranks[pid]] = os.waitstatus_to_exitcode(status)
            if codes[ranks[pid]] != 0 and failed is None:
                failed = ranks[pid]
                for other, rank in ranks.items():  # as torchrun does: one rank failed, stop the others
                    if rank not in codes:
                        _kill_group(other, signal.SIGTERM)
            continue
        if time.monotonic() > deadline:
            timed_out = True
            for other, rank in ranks.items():
                if rank not in codes:
                    _kill_group(other, signal.SIGKILL)
            deadline = float("inf")
        time.sleep(0.005)
    for pid in ranks:  # a rank's own children (DataLoader workers) do not outlive it
        _kill_group(pid, signal.SIGKILL)
    if rendezvous is not None:
        rendezvous.stop()
    code = codes[failed] if failed is not None else 0
    detail = "" if failed is None else f"rank {failed} failed (exitcode: {code}); exit codes {codes}"
    os.write(answer_fd, json.dumps({"returncode": code if code else (1 if timed_out else 0), "detail": detail,
                                    "timeout": timed_out}).encode())
    os._exit(0)


def warm_up() -> None:
    """What every training script imports, loaded once here (see run_scripts._warm_up for why
    torch._dynamo). Nothing that decides behaviour by being in sys.modules (horovod.torch,
    torch.distributed.fsdp) and none of the script's own modules."""
    import torch  # noqa: F401
    import torch._dynamo  # noqa: F401
    import torch.nn.parallel  # noqa: F401
    import torch.utils.data.distributed  # noqa: F401

    for name in ("numpy", "tqdm", "tqdm.auto"):
        try:
            __import__(name)
        except ImportError:
            pass


def launch(request: dict) -> dict:
    """Run one request (in a supervisor forked from this process) and return its answer."""
    read_fd, write_fd = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        os.close(read_fd)
        os.setpgid(0, 0)
        try:
            _supervise(request, write_fd)
        except BaseException as exc:  # noqa: BLE001 - the answer says what went wrong
            os.write(write_fd, json.dumps({"returncode": 1, "detail": f"warm launcher: {exc!r}",
                                           "timeout": False}).encode())
            os._exit(1)
    os.close(write_fd)
    chunks = []
    while True:
        chunk = os.read(read_fd, 65536)
        if not chunk:
            break
        chunks.append(chunk)
    os.close(read_fd)
    os.waitpid(pid, 0)
    answer = b"".join(chunks).decode()
    return json.loads(answer) if answer else {"returncode": 1, "detail": "warm launcher: no answer", "timeout": False}


def main() -> None:
    warm_up()
    out = sys.stdout
    for line in sys.stdin:
        if not line.strip():
            continue
        out.write(json.dumps(launch(json.loads(line))) + "\n")
        out.flush()


if __name__ == "__main__":
    main()
