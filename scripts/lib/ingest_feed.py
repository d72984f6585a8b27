"""The bench-ingest feed: N ~200-byte feed-contract messages, 10% replays (exact resends of
earlier lines), 50 sources. Deterministic: the same N gives the same file.

Usage: python3 scripts/lib/ingest_feed.py N FILE  (used by bench-ingest.sh, bench-callgrind.sh)
"""
import random
import sys

SOURCES, AGENCIES, SIZE = 50, 5, 200
REPLAY_EVERY, REPLAY_SPAN = 10, 15000
KINDS = ["fire", "medical", "traffic", "hazmat", "rescue", "alarm"]
LETTERS = "abcdefghijklmnopqrstuvwxyz"


def payload(s, seq):
    # A pure function of (source, sequence), so a replay is byte-identical.
    r = random.Random(s * 1_000_003 + seq)
    head = (
        '{"agency":"agency-%d","source_id":"unit-%03d","epoch":1,"sequence":%d,'
        '"kind":"%s","priority":%d,"lat":%d.%06d,"lon":%d.%06d,"note":"'
        % (s % AGENCIES, s, seq, r.choice(KINDS), r.randint(1, 5),
           r.randint(40, 49), r.randrange(10**6), r.randint(0, 9), r.randrange(10**6))
    )
    pad = max(1, SIZE - len(head) - 2)
    return head + "".join(r.choice(LETTERS) for _ in range(pad)) + '"}'


def main():
    n, path = int(sys.argv[1]), sys.argv[2]
    rng = random.Random(42)
    nxt = [1] * SOURCES
    replays = 0
    with open(path, "w") as f:
        out = []
        for i in range(1, n + 1):
            s = rng.randrange(SOURCES)
            top = nxt[s] - 1
            if i % REPLAY_EVERY == 0 and top > 0:
                out.append(payload(s, top - rng.randrange(min(top, REPLAY_SPAN))))
                replays += 1
            else:
                out.append(payload(s, nxt[s]))
                nxt[s] += 1
            if len(out) >= 10000:
                f.write("\n".join(out) + "\n")
                out = []
        if out:
            f.write("\n".join(out) + "\n")
    print("generated %d messages (%d replays)" % (n, replays), file=sys.stderr)


if __name__ == "__main__":
    main()
