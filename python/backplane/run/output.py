"""The ranks' output on bpl-run's console and in their log files: whole lines, each with its rank's prefix
(a line never mixes two ranks, nor a rank's and bpl-run's own)."""

import sys
import threading
import time

console_lock = threading.RLock()  # re-entrant: a signal handler on the main thread may tell() too


def tell(message):
    """One line of bpl-run's own on stderr, in one write under the console lock."""
    with console_lock:
        sys.stderr.write(message + "\n")
        sys.stderr.flush()


class FilteredLog:
    """torchrun's filtered_stdout.log or filtered_stderr.log: the lines of every local rank that hold one of
    the --duplicate-*-filters words, prefixed as on the console."""

    def __init__(self, path, words):
        self.words = [word.encode() for word in words]
        self.file = open(path, "wb") if words else None
        self.lock = threading.Lock()

    def offer(self, line):
        if self.file is not None and any(word in line for word in self.words):
            with self.lock:
                self.file.write(line)
                self.file.flush()

    def close(self):
        if self.file is not None:
            self.file.close()


class RankOutput:
    """Carries one stream of one rank to the console (unless it is kept off it), to its log file where
    --tee or --redirects asks, and to the filtered log."""

    def __init__(self, rank, pipe, console, prefix, log_path, to_console, filtered):
        self.rank, self.pipe, self.console, self.prefix = rank, pipe, console, prefix.encode()
        self.log = open(log_path, "wb") if log_path else None
        self.to_console, self.filtered = to_console, filtered
        self.thread = threading.Thread(target=self.carry, daemon=True)
        self.thread.start()

    def carry(self):
        for line in iter(self.pipe.readline, b""):
            if not line.endswith(b"\n"):
                line += b"\n"  # the last line of a rank that ended without one
            if self.log:
                self.log.write(line)
                self.log.flush()
            self.filtered.offer(self.prefix + line)
            if self.to_console:
                with console_lock:
                    try:
                        self.console.write(self.prefix + line)
                        self.console.flush()
                    except OSError:  # the console went away (a closed pipe): the rank's output is still drained
                        self.to_console = False
        self.pipe.close()
        if self.log:
            self.log.close()

    def finish(self, deadline):
        """Whether the rank's stream ended (every line carried) by `deadline` (time.monotonic())."""
        self.thread.join(timeout=max(0.0, deadline - time.monotonic()))
        return not self.thread.is_alive()
