#!/usr/bin/env python3
"""Torture run 3: the disk fills up mid-surge, and the disk fails with EIO mid-surge, under the
real `run` binary, the real redb file backend and real system calls. Needs root.

full:  a small ext4 file system (an image file in the temp dir, loop-mounted there) holds the
       database; a ballast file leaves only --free-mb MiB free; `run` consumes a live surge
       (private Mosquitto, field publisher at QoS 1) until a commit fails with ENOSPC. Checks:
       exit 2 with a one-line storage error naming it, no panic. The operator frees space
       (deletes the ballast) and restarts `run`. --rounds times, the ballast re-made each round.
eio:   the database lives on scripts/torture_faultfs.py, a pass-through FUSE file system over a
       directory of the temp dir; after a random number of commits of a live surge it starts
       failing every write, sync, truncate, create, rename with EIO (a failed disk; nothing
       reaches the directory below), at once or after 1-3 more successful syncs (a commit
       syncs twice, so the fault lands before, between and after them). Checks: exit 2 with a one-line storage error naming the
       I/O error, no panic. The disk comes back; `run` is restarted. --rounds times.
lose:  like eio, but Linux's behaviour after a failed writeback: writes "succeed" into a cache
       that reads see but never reach the directory below, and fsync fails with EIO; after the
       disk comes back `run` is restarted on the same mount, which still serves those stale,
       never-written pages (as the kernel keeps them after a failed fsync) until the final
       unmount.

Every part ends the same way: the publisher drains, a last `run` settles and stops with SIGTERM
(exit 0), a fresh incarnation receives nothing more, the file system is unmounted and mounted
again (so what is read is what reached the disk, not a cache), and the database must hold every
published event exactly once (dump-effects, dump-audit), nothing quarantined, `verify` exit 0.
A delivery acknowledged without its commit would be missing: the broker keeps everything
unacknowledged.

Why not device-mapper or a failing loop device for EIO: this kernel has no device-mapper
(no /dev/mapper/control, no dm-error/dm-flakey), and shrinking a loop device under a mounted
ext4 (LOOP_SET_STATUS64 sizelimit) gives real EIO once, but the second fault after an e2fsck
and remount hit a kernel BUG in ext4's allocator (fs/ext4/mballoc.c:4953) twice out of twice:
not something to run on a shared machine.

Usage: scripts/torture-disk.py [full|eio|lose|all] [--rounds N] [--rate R] [--free-mb M] [--seed S]
Defaults: all, 5 rounds, 1000 events/s, 4 MiB. One summary line per part; exit 0 if every
check held, 1 with the failing check (also when mounting is not permitted or python3-fusepy is
missing: nothing is skipped; `apt-get install python3-fusepy` provides it).
TORTURE_KEEP=1 keeps the temp dir (unmounted).
"""
import argparse
import collections
import os
import random
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torture_lib as T  # noqa: E402

FAULTFS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "torture_faultfs.py")
SYSTEM_PYTHON = "/usr/bin/python3"  # Debian's, where python3-fusepy lives


def sh(*args, ok=(0,)):
    p = subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    if p.returncode not in ok:
        raise T.Failed(f"{' '.join(args)} exited {p.returncode}: {p.stdout.decode()[-1000:]}")
    return p.stdout.decode()


class Ext4:
    """An ext4 image in `tmp`, on a loop device, mounted at tmp/mnt."""

    def __init__(self, tmp, mb):
        if os.geteuid() != 0:
            raise T.Failed("torture-disk needs root (loop devices and mount)")
        self.img = os.path.join(tmp, "disk.img")
        self.mnt = os.path.join(tmp, "mnt")
        os.makedirs(self.mnt, exist_ok=True)
        with open(self.img, "wb") as f:
            f.truncate(mb << 20)
        sh("mkfs.ext4", "-q", "-F", "-m", "0", self.img)
        self.dev = sh("losetup", "-f", "--show", self.img).strip()
        self.mounted = False
        self.mount()

    def mount(self):
        sh("mount", "-t", "ext4", self.dev, self.mnt)
        self.mounted = True

    def remount(self):
        """Unmount, check (e2fsck -fn must find nothing), mount: drops the page cache."""
        sh("umount", self.mnt)
        self.mounted = False
        sh("e2fsck", "-fn", self.dev)
        self.mount()

    def free_bytes(self):
        st = os.statvfs(self.mnt)
        return st.f_bavail * st.f_frsize

    def close(self):
        if self.mounted:
            if subprocess.run(["umount", self.mnt]).returncode != 0:
                subprocess.run(["umount", "-l", self.mnt])
        subprocess.run(["losetup", "-d", self.dev])


class FaultFS:
    """scripts/torture_faultfs.py over tmp/backing, mounted at tmp/mnt."""

    def __init__(self, tmp):
        if os.geteuid() != 0:
            raise T.Failed("torture-disk needs root (FUSE mounts)")
        if subprocess.run([SYSTEM_PYTHON, "-c", "import fusepy"], stderr=subprocess.DEVNULL).returncode != 0:
            raise T.Failed(f"{SYSTEM_PYTHON} cannot import fusepy: apt-get install python3-fusepy")
        self.backing = os.path.join(tmp, "backing")
        self.mnt = os.path.join(tmp, "mnt")
        self.ctl = os.path.join(tmp, "faultfs.ctl")
        self.log = os.path.join(tmp, "faultfs.log")
        os.makedirs(self.backing, exist_ok=True)
        os.makedirs(self.mnt, exist_ok=True)
        self.proc = None
        self.failed_before, self.failed_now = collections.Counter(), collections.Counter()
        self.lost_pages = 0
        self.mount()

    def mount(self):
        self.cached = 0
        for f in (self.ctl, self.ctl + ".ack"):
            if os.path.exists(f):
                os.remove(f)
        with open(self.log, "ab") as logf:
            self.proc = subprocess.Popen([SYSTEM_PYTHON, FAULTFS, self.backing, self.mnt, self.ctl],
                                         stdout=logf, stderr=logf)
        deadline = time.monotonic() + 10
        while not os.path.ismount(self.mnt):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise T.Failed(f"the fault file system did not mount: {self.log}")
            time.sleep(0.01)
        self.set_mode("ok")

    def set_mode(self, mode):
        tmp = self.ctl + ".tmp"
        with open(tmp, "w") as f:
            f.write(mode + "\n")
        os.rename(tmp, self.ctl)
        deadline = time.monotonic() + 5
        while True:
            try:
                with open(self.ctl + ".ack") as f:
                    got = f.read().split()
                if len(got) == 3 and got[0] == mode.replace(" ", "+"):
                    self.failed_now = collections.Counter(
                        {k: int(v) for k, v in (x.split("=") for x in got[1].split(",") if "=" in x)})
                    if mode == "ok":
                        self.lost_pages += int(got[2]) - self.cached
                    self.cached = int(got[2])
                    return
            except FileNotFoundError:
                pass
            if time.monotonic() > deadline:
                raise T.Failed(f"the fault file system did not switch to {mode}")
            time.sleep(0.001)

    @property
    def failed(self):
        """File system operations failed with EIO so far, over every mount, per operation."""
        return ", ".join(f"{v} {k}" for k, v in sorted((self.failed_before + self.failed_now).items()))

    def umount(self):
        self.failed_before += self.failed_now
        self.failed_now = collections.Counter()
        sh("umount", self.mnt)
        self.proc.wait(timeout=10)
        self.proc = None

    def remount(self):
        """Unmount (the kernel's and the file system's caches go) and mount again."""
        self.umount()
        self.mount()

    def close(self):
        if self.proc:
            if subprocess.run(["umount", self.mnt]).returncode != 0:
                subprocess.run(["umount", "-l", self.mnt])
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def commits(run):
    return run.log_text().count("batch committed")


def wait_exit(run, limit, what):
    rc = run.wait_exit(limit)
    if rc is None:
        run.kill9()
        raise T.Failed(f"{what}: run still running {limit} s after the fault: {run.logfile}")
    return rc


def last_line(run):
    lines = [l for l in run.log_text().splitlines() if l.strip()]
    return lines[-1] if lines else ""


def torture(part, a, tmp):
    os.makedirs(tmp)
    t0 = time.monotonic()
    rng = random.Random(a.seed)
    disk = Ext4(tmp, a.disk_mb) if part == "full" else FaultFS(tmp)
    broker = T.Broker(os.path.join(tmp, "broker"), T.free_port())
    broker.start()
    db = os.path.join(disk.mnt, "rg.redb")
    cfg = os.path.join(tmp, "rg.toml")
    T.write_config(cfg, db, [broker.port], f"torture-{part}")
    run = T.Run(tmp, cfg)
    pub = None
    rounds, errors, after_syncs = [], set(), []
    want = {"full": "No space left on device (os error 28)"}.get(part, "Input/output error (os error 5)")
    try:
        run.start()
        T.settle_connected(run)
        if run.stop() != 0:
            raise T.Failed(f"first run did not stop cleanly: {run.logfile}")
        pub = T.Publisher(tmp, [broker.port], f"field-{part}", a.rate, seed=a.seed)
        ballast = os.path.join(disk.mnt, "ballast")
        for r in range(a.rounds):
            if part == "full":
                size = disk.free_bytes() - (a.free_mb << 20)
                if size > 0:
                    with open(ballast, "wb") as f:
                        os.posix_fallocate(f.fileno(), 0, size)
                        os.fsync(f.fileno())
            run.start()
            if part == "full":
                rc = wait_exit(run, 120, f"round {r}")
            else:
                # The fault lands after a random number of this incarnation's commits, at a
                # random moment of the commit cycle.
                target = rng.randint(1, 60)
                deadline = time.monotonic() + 60
                while commits(run) < target:
                    if run.proc.poll() is not None or time.monotonic() > deadline:
                        raise T.Failed(f"round {r}: run exited or stalled before the fault: {run.logfile}")
                    time.sleep(0.002)
                time.sleep(rng.uniform(0, 0.02))
                # At once, or after 1-3 more successful syncs: a redb commit syncs twice
                # (two-phase, for quick repair), so faults land before, between and after them.
                after = rng.randint(0, 3)
                disk.set_mode(f"{part} {after}" if after else part)
                after_syncs.append(after)
                rc = wait_exit(run, 60, f"round {r}")
            c = commits(run)
            err = last_line(run)
            text = run.log_text()
            if rc != 2 or "panicked" in text:
                raise T.Failed(f"round {r}: run exited {rc} (want 2): {err}")
            if "error:" not in err or want not in err:
                raise T.Failed(f"round {r}: the last line is not the storage error naming '{want}': {err}")
            rounds.append(c)
            errors.add(err.split("error: ", 1)[-1])
            if part == "full":
                os.remove(ballast)
            else:
                disk.set_mode("ok")
            T.log(f"{part} round {r + 1}: exit 2 after {c} commits: {err.split('error: ', 1)[-1][:150]}")
        stats = pub.finish()
        n = stats["events"]
        run.start()
        decisions = T.settle(db, run, n)
        if run.stop() != 0:
            raise T.Failed(f"final run did not stop cleanly: {run.logfile}")
        T.assert_session_empty(db, run)
        disk.remount()
        outcomes, _, verify = T.check_exactly_once(db, n)
        dt = time.monotonic() - t0
        failed_ops = ""
        if part != "full":
            failed_ops = (f"; armed to fail after {', '.join(map(str, after_syncs))} more syncs; the file "
                          f"system failed {disk.failed} with EIO")
            if part == "lose":
                failed_ops += f" and kept {disk.lost_pages} written pages that never reached the disk in its cache"
        print(f"torture-disk {part}: {a.rounds} faults mid-surge in {dt:.0f} s, each ended by exit 2 with "
              f"the one-line storage error naming '{want}', no panic (after {', '.join(map(str, rounds))} "
              f"commits of the incarnation{failed_ops}); {n} events published, {decisions} deliveries "
              f"decided: {dict(outcomes)}; after remounting, every event applied exactly once (nothing "
              f"acknowledged that was not committed), nothing quarantined; {verify.split(':')[0]} exit 0",
              flush=True)
        print(f"  error line(s): {sorted(errors)}", flush=True)
    finally:
        if pub:
            pub.kill()
        if run.proc:
            run.kill9()
        broker.stop()
        disk.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("part", nargs="?", default="all", choices=["full", "eio", "lose", "all"])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--rate", type=float, default=1000)
    ap.add_argument("--free-mb", type=int, default=4)
    ap.add_argument("--disk-mb", type=int, default=256)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    T.build()
    ok = False
    tmp = tempfile.mkdtemp(prefix="rg-torture-disk.")
    try:
        for part in (["full", "eio", "lose"] if a.part == "all" else [a.part]):
            torture(part, a, os.path.join(tmp, part))
        ok = True
    except T.Failed as e:
        print(f"torture-disk FAILED: {e}", flush=True)
    finally:
        T.keep_or_remove(tmp, ok)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
