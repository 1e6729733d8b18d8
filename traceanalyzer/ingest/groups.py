"""Rank groups: many small ranks stored, and analysed, together (``store.rank_shards``), planned
from the input alone; and the units ingest runs as one task each."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path

from traceanalyzer.discover import RankSession
from traceanalyzer.store import Manifest, group_name, remove_group

# Many small ranks are stored, and analysed, in rank groups (store.rank_shards): a rank of a few
# hundred KB costs more in fixed costs (its files, its tasks, each map's queries) than in
# parsing. A rank of at most SMALL_RANK_BYTES of exported files is small; a collection with at
# least GROUP_FROM_RANKS of them packs them, in rank order, into groups of about an eighth of
# them (a pool of up to eight workers stays busy), GROUP_RANKS and GROUP_BYTES at most. The
# plan depends on the input alone, never on the executor: every backend stores and judges the
# same shards, so their findings agree.
SMALL_RANK_BYTES = 4 << 20
GROUP_FROM_RANKS = 32
GROUP_RANKS = 64
GROUP_BYTES = 64 << 20
_GROUPS_AT_LEAST = 8


def plan_groups(sessions: Iterable[RankSession], sizes: Mapping[str, int]) -> dict[str, str]:
    """The rank group of each session stored in one (session key -> group name); sessions not
    named are stored on their own. ``sizes``: each session's input bytes, by key."""
    by_rank: dict[int, list[RankSession]] = {}
    for session in sessions:
        by_rank.setdefault(session.rank, []).append(session)
    weight = {rank: sum(sizes[s.key] for s in members) for rank, members in by_rank.items()}
    small = [rank for rank in sorted(by_rank) if weight[rank] <= SMALL_RANK_BYTES]
    if len(small) < GROUP_FROM_RANKS:
        return {}
    most = min(GROUP_RANKS, -(-len(small) // _GROUPS_AT_LEAST))
    groups: list[list[int]] = [[]]
    held = 0
    for rank in small:
        if groups[-1] and (len(groups[-1]) >= most or held + weight[rank] > GROUP_BYTES):
            groups.append([])
            held = 0
        groups[-1].append(rank)
        held += weight[rank]
    return {
        session.key: group_name(ranks)
        for ranks in groups
        if len(ranks) > 1  # a group of one rank is that rank stored on its own
        for rank in ranks
        for session in by_rank[rank]
    }


def plan_units(
    sessions: Iterable[RankSession], groups: Mapping[str, str]
) -> list[tuple[str | None, list[RankSession]]]:
    """What ingest runs as one task, in discovery order: each session stored on its own
    (``None``), and each rank group with its sessions."""
    units: list[tuple[str | None, list[RankSession]]] = []
    members: dict[str, list[RankSession]] = {}
    for session in sessions:
        group = groups.get(session.key)
        if group is None:
            units.append((None, [session]))
        elif group in members:
            members[group].append(session)
        else:
            members[group] = [session]
            units.append((group, members[group]))
    return units


def recorded_groups(manifest: Manifest) -> dict[str, set[str]]:
    """The session keys the manifest records in each rank group."""
    groups: dict[str, set[str]] = {}
    for key, entry in manifest.sessions.items():
        group = entry.get("group")
        if isinstance(group, str):
            groups.setdefault(group, set()).add(key)
    return groups


def drop_group(out: Path, manifest: Manifest, group: str) -> None:
    """Forget a rank group: its files and its sessions' entries (they are ingested again)."""
    remove_group(out, group)
    for key in [k for k, v in manifest.sessions.items() if v.get("group") == group]:
        del manifest.sessions[key]
