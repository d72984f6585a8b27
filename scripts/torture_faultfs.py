#!/usr/bin/python3
"""A fault-injecting pass-through file system (FUSE) for scripts/torture-disk.py: the real
`replay-guard` binary, through the real redb file backend and real system calls, gets EIO from
the kernel when the harness says so. Needs Debian's python3-fusepy (libfuse2) and root.

Usage: torture_faultfs.py BACKING_DIR MOUNTPOINT CONTROL_FILE

The harness writes a mode into CONTROL_FILE (atomically: temp file + rename); within a few
milliseconds the file system switches to it and writes the same line to CONTROL_FILE.ack,
followed by a line of operations failed so far (`write=1,fsync=2`, or `-`) and the number of
cached pages that never reached the disk. Modes:

  MODE N  stay as is until N more syncs have succeeded, then switch to MODE (so a fault can
        land between the two syncs of a redb two-phase commit).
  ok    every operation passes through to BACKING_DIR.
  eio   the disk has failed: every write, sync, truncate, create, link, rename, unlink, chmod
        fails with EIO and changes nothing underneath; reads still work.
  lose  Linux after a failed writeback: writes "succeed" into a cache that reads see, but never
        reach BACKING_DIR; fsync/fdatasync fail with EIO. Switching back to `ok` keeps those
        cached pages (never written), as the kernel keeps clean pages after a failed fsync,
        until the file system is unmounted; a later write to such a page writes all of it.
"""
import errno
import os
import sys
import threading
import time

import fusepy as fuse

PAGE = 4096


class FaultFS(fuse.Operations):
    def __init__(self, root, control):
        self.root = os.path.realpath(root)
        self.control = control
        self.mode = "ok"
        self.armed = None  # (mode, n): switch to mode once n more syncs have succeeded
        self.failed = {}  # operation name -> how many failed with EIO
        self.cache = {}  # (dev, ino) -> {page index: bytearray(PAGE)}: pages that never reached the disk
        self.mutex = threading.Lock()
        threading.Thread(target=self.watch, daemon=True).start()

    # --- control ---
    def watch(self):
        seen = None
        while True:
            try:
                st = os.stat(self.control)
                if st.st_mtime_ns != seen:
                    seen = st.st_mtime_ns
                    with open(self.control) as f:
                        line = f.read().strip()
                    mode, _, after = line.partition(" ")
                    if mode in ("ok", "eio", "lose"):
                        with self.mutex:
                            if after:
                                self.armed = (mode, int(after))
                            else:
                                self.mode, self.armed = mode, None
                        mode = line.replace(" ", "+")
                        tmp = self.control + ".ack.tmp"
                        with self.mutex:
                            failed = ",".join(f"{k}={v}" for k, v in sorted(self.failed.items()))
                            lost = sum(len(p) for p in self.cache.values())
                        with open(tmp, "w") as f:
                            f.write(f"{mode}\n{failed or '-'}\n{lost}\n")
                        os.rename(tmp, self.control + ".ack")
            except FileNotFoundError:
                pass
            time.sleep(0.001)

    def fail_if(self, op, *modes):
        if self.mode in modes:
            self.failed[op] = self.failed.get(op, 0) + 1
            raise fuse.FuseOSError(errno.EIO)

    def __call__(self, op, path, *args):
        return super().__call__(op, self.root + path, *args)

    # --- metadata ---
    def getattr(self, path, fh=None):
        st = os.fstat(fh) if fh is not None else os.lstat(path)
        return {k: getattr(st, k) for k in ("st_atime", "st_ctime", "st_gid", "st_mode", "st_mtime",
                                            "st_nlink", "st_size", "st_uid", "st_ino")}

    def access(self, path, amode):
        if not os.access(path, amode):
            raise fuse.FuseOSError(errno.EACCES)

    def readdir(self, path, fh):
        return [".", ".."] + os.listdir(path)

    def statfs(self, path):
        sv = os.statvfs(path)
        return {k: getattr(sv, k) for k in ("f_bavail", "f_bfree", "f_blocks", "f_bsize", "f_favail",
                                            "f_ffree", "f_files", "f_flag", "f_frsize", "f_namemax")}

    readlink = os.readlink
    getxattr = None
    listxattr = None
    lock = None  # ENOSYS: the kernel keeps POSIX and flock locks locally, as on a local disk

    def chmod(self, path, mode):
        self.fail_if("chmod", "eio")
        os.chmod(path, mode)

    def chown(self, path, uid, gid):
        self.fail_if("chown", "eio")
        os.chown(path, uid, gid)

    def utimens(self, path, times=None):
        os.utime(path, times)

    def mkdir(self, path, mode):
        self.fail_if("mkdir", "eio")
        os.mkdir(path, mode)

    def rmdir(self, path):
        self.fail_if("rmdir", "eio")
        os.rmdir(path)

    def unlink(self, path):
        self.fail_if("unlink", "eio")
        os.unlink(path)

    def rename(self, old, new):
        self.fail_if("rename", "eio")
        os.rename(old, self.root + new)

    def link(self, target, source):
        self.fail_if("link", "eio")
        os.link(self.root + source, target)

    def symlink(self, target, source):
        self.fail_if("symlink", "eio")
        os.symlink(source, target)

    # --- files ---
    def open(self, path, flags):
        return os.open(path, flags)

    def create(self, path, mode, fi=None):
        self.fail_if("create", "eio")
        return os.open(path, os.O_RDWR | os.O_CREAT, mode)

    def release(self, path, fh):
        os.close(fh)

    def flush(self, path, fh):
        return 0

    def key(self, fh):
        st = os.fstat(fh)
        return (st.st_dev, st.st_ino)

    def read(self, path, size, offset, fh):
        data = bytearray(os.pread(fh, size, offset))
        with self.mutex:
            pages = self.cache.get(self.key(fh))
            if pages:
                end = offset + len(data)
                for p in range(offset // PAGE, (end + PAGE - 1) // PAGE):
                    if p in pages:
                        lo, hi = max(offset, p * PAGE), min(end, (p + 1) * PAGE)
                        data[lo - offset:hi - offset] = pages[p][lo - p * PAGE:hi - p * PAGE]
        return bytes(data)

    def write(self, path, data, offset, fh):
        with self.mutex:
            self.fail_if("write", "eio")
            k = self.key(fh)
            end = offset + len(data)
            if self.mode == "lose":
                pages = self.cache.setdefault(k, {})
                for p in range(offset // PAGE, (end + PAGE - 1) // PAGE):
                    if p not in pages:
                        base = bytearray(os.pread(fh, PAGE, p * PAGE))
                        pages[p] = base + bytearray(PAGE - len(base))
                    lo, hi = max(offset, p * PAGE), min(end, (p + 1) * PAGE)
                    pages[p][lo - p * PAGE:hi - p * PAGE] = data[lo - offset:hi - offset]
                return len(data)
            n = os.pwrite(fh, data, offset)
            pages = self.cache.get(k)
            if pages:
                # A cached page written again is dirty again: the kernel writes all of it back,
                # never-written bytes included, so it reaches the disk whole.
                size = max(os.fstat(fh).st_size, end)
                for p in range(offset // PAGE, (end + PAGE - 1) // PAGE):
                    page = pages.pop(p, None)
                    if page is not None:
                        lo, hi = max(offset, p * PAGE), min(end, (p + 1) * PAGE)
                        page[lo - p * PAGE:hi - p * PAGE] = data[lo - offset:hi - offset]
                        os.pwrite(fh, bytes(page[:max(0, min(PAGE, size - p * PAGE))]), p * PAGE)
            return n

    def truncate(self, path, length, fh=None):
        self.fail_if("truncate", "eio")
        if fh is not None:
            os.ftruncate(fh, length)
        else:
            os.truncate(path, length)

    def fsync(self, path, datasync, fh):
        self.fail_if("fdatasync" if datasync else "fsync", "eio", "lose")
        if datasync:
            os.fdatasync(fh)
        else:
            os.fsync(fh)
        with self.mutex:
            if self.armed:
                mode, n = self.armed
                self.armed = (mode, n - 1) if n > 0 else None
                if n <= 1:
                    self.mode, self.armed = mode, None


def main():
    backing, mnt, control = sys.argv[1:4]
    fuse.FUSE(FaultFS(backing, control), mnt, foreground=True, nothreads=False, fsname="torture-faultfs")


if __name__ == "__main__":
    main()
