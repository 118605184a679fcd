"""Which rank a failed collective lost, and how that was seen.

A gloo collective that fails says only what this rank saw: a connection that closed, at
the peer's address, or a wait that ran out. The message a user needs names the *other*
rank (the one that died or stalled), so a :class:`RankWatch` keeps three kinds of evidence
in the group's store, each best effort:

* **Addresses.** A connection error names the peer's address ("Connection closed by peer
  [127.0.0.1]:44416"): where the peer listens if this rank opened the connection, the
  peer's own end of it if the peer did (gloo picks one side of each pair). gloo's
  rendezvous leaves each rank's record in the store (host name and listening address, in
  gloo's layout, torch 2.13's); each rank also publishes the local ends of the connections
  it opened (its own sockets, from ``/proc/self/fd``). Read when the group is made (so
  they hold when the rank that died hosted the store) and again if an address is not
  among them, they map the address to a rank.
* **Failure notes.** A rank that fails writes what it found before it raises. A rank
  whose group ends after its own failure closes its connections too, so a peer that sees
  that closure reads its note and names the rank that note names, not the messenger.
* **Marks.** A rank that has waited for a collective longer than ``mark_after_s`` writes
  torch's sequence number of it. After a timeout, the ranks whose mark is older had not
  come to the collective: those are the stalled ones. A mark is one write, only on waits
  that long (rare in a healthy job), and the wait goes on meanwhile.

What cannot be known is said plainly: a rank that died without its connection closing
(its machine lost) looks stalled; an address that matches nothing stays an address; a
store that no longer answers (its host may be the rank that is gone) leaves notes unread.
"""

from __future__ import annotations

import datetime
import os
import re
import socket
import struct
import time
from typing import Any, NamedTuple

# gloo's errors on a pair name the peer's address: "Connection closed by peer [ip]:port",
# "Read error [ip]:port: Connection reset by peer", "writev [ip]:port: Broken pipe", ...
_PEER_ERROR = re.compile(
    r"(Connection closed by peer|Socket unexpectedly closed|Socket closed|Read error|writev|Read timeout|Write timeout)"
    r" \[([^\]]+)\]:(\d+)(?::\s*([A-Za-z][A-Za-z ]*))?"
)
_HOW = {
    "Read timeout": "sent nothing on its connection within gloo's timeout",
    "Write timeout": "took nothing from its connection within gloo's timeout",
    "Connection reset by peer": "reset its connection",
}
_STORE_WAIT_S = 5.0  # a store that does not answer within this is taken as gone
_MAX_NAMED = 8  # ranks named in one message; the rest are counted


def _record_address(record: bytes) -> tuple[str, str, int] | None:
    """(host name, listening IP, port) from a gloo tcp rank record, or None if it does not
    parse: a size_t-prefixed host name, then a size_t-prefixed address whose first bytes
    are a ``sockaddr_in``/``sockaddr_in6`` (family in host order, port in network order)."""
    try:
        (host_size,) = struct.unpack_from("=Q", record, 0)
        host = record[8 : 8 + host_size].decode("utf-8", "replace")
        at = 8 + host_size + 8
        (family,) = struct.unpack_from("=H", record, at)
        (port,) = struct.unpack_from("!H", record, at + 2)
        if family == socket.AF_INET:
            return host, socket.inet_ntop(socket.AF_INET, record[at + 4 : at + 8]), port
        if family == socket.AF_INET6:
            return host, socket.inet_ntop(socket.AF_INET6, record[at + 8 : at + 24]), port
    except (struct.error, ValueError, OSError):
        pass
    return None


def _own_sockets(listeners: set[tuple[str, int]], store_port: int | None) -> tuple[list[tuple[str, int]], bool]:
    """From this process's TCP sockets (Linux): the local ends of its connections to one
    of ``listeners``, and whether it listens on ``store_port`` (serves the job's store)."""
    ends: list[tuple[str, int]] = []
    serves = False
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        return ends, serves
    for name in names:
        try:
            if not os.readlink(f"/proc/self/fd/{name}").startswith("socket:"):
                continue
            with socket.socket(fileno=os.dup(int(name))) as sock:  # a copy: closing it leaves gloo's
                if sock.family not in (socket.AF_INET, socket.AF_INET6) or sock.type != socket.SOCK_STREAM:
                    continue
                local = sock.getsockname()
                if sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
                    serves = serves or local[1] == store_port
                    continue
                peer = sock.getpeername()
                if (peer[0], peer[1]) in listeners:
                    ends.append((local[0], local[1]))
        except (OSError, ValueError):
            continue  # closed meanwhile, or not connected
    return ends, serves


def _store_port(store: Any) -> int | None:
    """The port of the TCPStore under ``store``'s prefixes, if it is one."""
    while hasattr(store, "underlying_store"):
        store = store.underlying_store
    port = getattr(store, "port", None)
    return port if isinstance(port, int) else None


def name_ranks(ranks: tuple[int, ...] | list[int]) -> str:
    """The ranks as words ("rank 1", "ranks 1 and 3", "ranks 1, 2, ... (12 ranks)"), bounded."""
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    shown = ", ".join(str(r) for r in ranks[:_MAX_NAMED])
    if len(ranks) > _MAX_NAMED:
        return f"ranks {shown}, ... ({len(ranks)} ranks)"
    head, _, last = shown.rpartition(", ")
    return f"ranks {head} and {last}"


class Noted(NamedTuple):
    """What a rank's failure note says: its finding, the ranks it names, how it failed."""

    finding: str
    lost: tuple[int, ...]
    timed_out: bool


class RankWatch:
    """The evidence of one group of all ranks (see the module docs)."""

    def __init__(self, dist: Any, group: Any, rank: int, world_size: int, timeout_s: float, namespace: str):
        self.rank, self.world_size = rank, world_size
        self.mark_after_s = min(1.0, timeout_s / 4)
        self._addresses: dict[tuple[str, int], int] = {}
        self._hosts: dict[int, str] = {}
        self._store: Any = None
        self._store_gone = ""  # why the store stopped answering, once it has
        self._served_by: int | None = None  # the rank whose process serves the store, if one does
        self._unread = ""  # why addresses could not be read, if they could not
        try:
            from torch.distributed import PrefixStore, distributed_c10d

            store = distributed_c10d._get_process_group_store(group if group is not None else dist.group.WORLD)
            store_port = _store_port(store)
            try:  # a client of its own, so a short timeout does not change the user's store
                store = store.clone()  # type: ignore[attr-defined]  # in torch's Store, not in its stubs
                store.set_timeout(datetime.timedelta(seconds=min(_STORE_WAIT_S, timeout_s)))
            except Exception:
                pass  # a store that cannot be cloned (a FileStore): used as it is
            self._store = PrefixStore(namespace, store)
            # gloo's rendezvous keys: the backend's "cpu/" prefix, then device 0's.
            records = PrefixStore("0", PrefixStore("cpu/", store))
            keys = [str(r) for r in range(world_size)]
            if not records.check(keys):
                self._unread = "the group's store holds no gloo addresses"
                return
            listeners: set[tuple[str, int]] = set()
            for peer, record in enumerate(records.multi_get(keys)):
                found = _record_address(bytes(record))
                if found is not None:
                    host, ip, port = found
                    self._hosts[peer] = host
                    self._add(ip, port, peer)
                    if peer != rank:
                        listeners.add((ip, port))
            opened, serves = _own_sockets(listeners, store_port)
            self._store.set(f"opened/{rank}", ",".join(f"{ip}|{port}" for ip, port in opened))
            if serves:  # the store dies with this process: its silence then says so
                self._store.set("served_by", str(rank))
        except Exception as err:  # evidence is optional: the collectives work without it
            self._unread = f"{type(err).__name__}: {str(err)[:120]}"

    def learn(self) -> None:
        """Read the connections the other ranks opened (each published its own when the
        group was made: after the group's set-up barrier, all are there), and which rank
        serves the store."""
        try:
            served_by = self._read("served_by")
            if served_by is not None:
                self._served_by = int(served_by)
            for peer in range(self.world_size):
                key = f"opened/{peer}"
                if peer == self.rank or self._store is None or not self._store.check([key]):
                    continue
                for end in bytes(self._store.get(key)).decode().split(","):
                    if end:
                        ip, port = end.rsplit("|", 1)
                        self._add(ip, int(port), peer)
        except Exception as err:
            self._unread = f"{type(err).__name__}: {str(err)[:120]}"

    def mark_waiting(self, sequence: int) -> None:
        """Record that this rank has been waiting for collective ``sequence``."""
        self._write(f"waiting/{self.rank}", str(sequence))

    def note_failure(self, finding: str, lost: tuple[int, ...], timed_out: bool) -> None:
        """Record what this rank found, for the ranks still waiting, and count it."""
        kind = "timeout" if timed_out else "failed"
        self._write(f"failed/{self.rank}", f"{kind}|{','.join(map(str, lost))}|{finding[:300]}")
        try:
            if self._store is not None:
                self._store.add("failures", 1)
        except Exception as err:
            self._lose_store(err)

    def failure_elsewhere(self) -> Noted | None:
        """What another rank that failed in this group found, if one did (one store call
        when none did); ``timed_out`` if it failed by waiting its whole timeout."""
        try:
            if self._store is None or self._store.add("failures", 0) == 0:
                return None
        except Exception as err:
            self._lose_store(err)
            return None
        for peer in range(self.world_size):
            if peer != self.rank:
                noted = self._noted(peer)
                if noted is not None:
                    return Noted(f"rank {peer} failed first: {noted.finding}", noted.lost, noted.timed_out)
        return None

    def _noted(self, peer: int) -> Noted | None:
        """``peer``'s failure note (``lost``: the ranks it names besides this one)."""
        note = self._read(f"failed/{peer}")
        if note is None:
            return None
        kind, _, rest = note.partition("|")
        named, _, finding = rest.partition("|")
        lost = tuple(int(r) for r in named.split(",") if r and int(r) != self.rank)
        return Noted(finding, lost, kind == "timeout")

    def explain_failure(self, err: BaseException) -> tuple[str, tuple[int, ...]]:
        """What a collective's error says of the other ranks, and the ranks it names."""
        text = str(err)
        found = _PEER_ERROR.search(text)
        if found is None:
            return f"a collective failed (gloo: {text[:300]})", ()
        kind, ip, port, detail = found.group(1), found.group(2), int(found.group(3)), (found.group(4) or "").strip()
        how = _HOW.get(kind) or _HOW.get(detail) or "closed its connection" + (f" ({detail})" if detail else "")
        seen = f"gloo: {found.group(0)}"
        peer = self._addresses.get((ip, port))
        if peer is None:
            self.learn()  # a rank may have published after this one read
            peer = self._addresses.get((ip, port))
        if peer is None:
            why = self._unread or "no rank's gloo address matches"
            return f"the rank at [{ip}]:{port} {how} ({seen}); which rank that is could not be told ({why})", ()
        noted = self._noted(peer)
        if noted is not None:  # it ended after failing itself: name what it found
            return f"rank {peer} {how} ({seen}) after it failed: {noted.finding}", noted.lost
        closed = f"rank {peer}{self._host(peer)} {how} ({seen})"
        if self._store is not None:
            return closed, (peer,)
        # The store does not answer, so no note can say whether the peer failed first.
        host = self._served_by
        if host is not None and host not in (peer, self.rank):
            return f"{self._store_host_gone(host)}; first seen as: {closed}, which may have failed over it", (host,)
        if host == peer:
            return f"{closed}; the job's store, which its process served, does not answer either", (peer,)
        return f"{closed}; whether it failed over another rank first could not be told ({self._store_gone})", (peer,)

    def _store_host_gone(self, host: int) -> str:
        return (
            f"rank {host}{self._host(host)} is gone: the job's store its process served does "
            f"not answer ({self._store_gone})"
        )

    def explain_timeout(self, sequence: int, timeout_s: float) -> tuple[str, tuple[int, ...]]:
        """Which ranks had not come to collective ``sequence`` when this rank gave up on it."""
        if self._store is None:
            return self._store_silent(timeout_s)
        others = [r for r in range(self.world_size) if r != self.rank]
        late: list[int] = []
        try:
            # A rank marks itself after waiting mark_after_s: give ranks that came to the
            # collective before this rank's deadline that long to show it.
            deadline = time.monotonic() + self.mark_after_s + 0.2
            while True:
                late = [r for r in others if int(self._read(f"waiting/{r}", raising=True) or -1) < sequence]
                if not late or time.monotonic() >= deadline:
                    break
                time.sleep(0.05)
        except Exception:
            return self._store_silent(timeout_s)
        if not late:
            return (
                f"no answer within {timeout_s:g} s though every rank had come to this collective; which rank "
                "stopped answering could not be told",
                (),
            )
        # A rank that failed in it left a note (and wrote no mark): what it found comes first.
        for peer in late:
            noted = self._noted(peer)
            if noted is not None:
                return f"no answer within {timeout_s:g} s: rank {peer} failed first: {noted.finding}", noted.lost
        hosts = "".join(self._host(r) for r in late[:1]) if len(late) == 1 else ""
        return (
            f"{name_ranks(late)}{hosts} sent nothing within {timeout_s:g} s: not come to this collective "
            "(stalled, or died without its connection closing, as when a machine is lost)",
            tuple(late),
        )

    def _store_silent(self, timeout_s: float) -> tuple[str, tuple[int, ...]]:
        host = self._served_by
        if host is not None and host != self.rank:
            return f"{self._store_host_gone(host)}; no answer within {timeout_s:g} s", (host,)
        return (
            f"no answer within {timeout_s:g} s; which rank stopped answering could not be told (the job's store "
            f"does not answer either: {self._store_gone or 'unread'})",
            (),
        )

    def _add(self, ip: str, port: int, peer: int) -> None:
        # gloo prints a port as stored, in network byte order: both readings name the rank
        self._addresses[(ip, port)] = peer
        self._addresses[(ip, struct.unpack("<H", struct.pack(">H", port))[0])] = peer

    def _write(self, key: str, value: str) -> None:
        if self._store is not None:
            try:
                self._store.set(key, value)
            except Exception as err:
                self._lose_store(err)

    def _read(self, key: str, raising: bool = False) -> str | None:
        try:
            if self._store is not None and self._store.check([key]):
                return bytes(self._store.get(key)).decode("utf-8", "replace")
        except Exception as err:
            self._lose_store(err)
            if raising:
                raise
        return None

    def _lose_store(self, err: BaseException) -> None:
        # gone: no further calls (each failed one also costs a warning from torch)
        self._store = None
        self._store_gone = f"{type(err).__name__}: {str(err).splitlines()[0][:120] if str(err) else ''}"

    def _host(self, peer: int) -> str:
        host = self._hosts.get(peer)
        return f" (on {host})" if host else ""
