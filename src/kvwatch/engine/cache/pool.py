"""PagePool: one cache group's pages, their data tensor and their ownership tags.

Layout of the data tensor::

    data[page, slot, *token_shape]        slot in [0, page_size)

Page data lives in a torch tensor (on the engine's device). The bookkeeping
lives in numpy arrays on the host: a page's owner tag (``owner_kind``,
``owner_id``) and the free stack (``_free[:_top]``, ``alloc`` pops its top).
Page ids travel as ``int64`` numpy arrays. The audit checks a million pages
with a handful of vectorised ops, and the small scatters of every engine step
cost well under a microsecond each.

Invariants kept by every method here:

* a page is on the free stack exactly when its tag is ``FREE``;
* ``free`` and ``transfer`` only act on pages the caller names as their owner,
  each named once, so a double free or a free by the wrong holder raises
  ``OwnershipError`` instead of silently corrupting the stack.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple, NoReturn

import numpy as np
import torch

from kvwatch.engine.cache.owner import Owner, OwnerKind

PageIds = np.ndarray  # int64 page ids
SHORT_RUN = 8  # up to this many pages, ownership is checked page by page in Python
LISTED_RUN = 96  # up to this many, on tags gathered into Python lists; beyond, vectorised
DENSE_RUN = 8  # a run naming 1 page in this many of the pool or more is checked on a map


class PoolExhausted(RuntimeError):
    """Not enough free pages in a group, even after eviction and pruning."""

    def __init__(self, group: str, needed: int, free: int, capacity: int, tier: str = "device"):
        self.group, self.needed, self.free, self.capacity = group, needed, free, capacity
        super().__init__(
            f"{group} ({tier}) is out of pages: needed {needed}, free {free} of {capacity}"
        )


class OwnershipError(RuntimeError):
    """A page was freed or moved by someone who does not own it."""


class AuxField(NamedTuple):
    """A second per-token tensor that lives and dies with the same pages."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype


@dataclass(frozen=True)
class PageLayout:
    """Shape of one token's entry in a page, its dtype, and any auxiliary fields."""

    token_shape: tuple[int, ...] = ()
    dtype: torch.dtype = torch.float32
    aux: tuple[AuxField, ...] = ()


class PoolSnapshot(NamedTuple):
    """Pure copy of a pool's bookkeeping, for audits and probes."""

    group: str
    tier: str
    capacity: int
    free_pages: np.ndarray
    owner_kind: np.ndarray
    owner_id: np.ndarray


def as_index(pages: PageIds | Sequence[int]) -> np.ndarray:
    return np.asarray(pages, dtype=np.int64)


def _numpy_view(data: torch.Tensor) -> np.ndarray | None:
    """``data``'s memory as a numpy array, where it is on the CPU in a dtype numpy has."""
    if data.device.type != "cpu":
        return None
    try:
        return data.numpy()
    except TypeError:  # bfloat16 and the like
        return None


class PagePool:
    def __init__(
        self,
        group: str,
        page_size: int,
        capacity: int,
        layout: PageLayout,
        *,
        device: str | torch.device = "cpu",
        tier: str = "device",
    ) -> None:
        self.group = group
        self.page_size = page_size
        self.capacity = capacity
        self.tier = tier
        self.layout = layout
        self.data = torch.zeros(
            (capacity, page_size, *layout.token_shape), dtype=layout.dtype, device=device
        )
        self.aux = {
            f.name: torch.zeros((capacity, page_size, *f.shape), dtype=f.dtype, device=device)
            for f in layout.aux
        }
        self._tokens = self.data.view(capacity * page_size, *layout.token_shape)
        self._host = _numpy_view(self.data)
        self.owner_kind = np.zeros(capacity, dtype=np.int8)
        self.owner_id = np.full(capacity, -1, dtype=np.int64)
        # Reversed so that a fresh pool hands out pages 0, 1, 2, ...
        self._free = np.arange(capacity - 1, -1, -1, dtype=np.int64)
        self._top = capacity

    # -- counts -------------------------------------------------------------
    @property
    def free_count(self) -> int:
        return self._top

    @property
    def used_count(self) -> int:
        return self.capacity - self._top

    # -- ownership ------------------------------------------------------------
    def alloc(self, n: int, owner: Owner) -> PageIds:
        """Pop ``n`` free pages and tag them with ``owner``; raise if short."""
        if n < 0:
            raise ValueError(f"cannot allocate {n} pages")
        if n > self._top:
            raise PoolExhausted(self.group, n, self._top, self.capacity, self.tier)
        pages = self._free[self._top - n : self._top][::-1].copy()
        self._top -= n
        self.owner_kind[pages] = int(owner.kind)
        self.owner_id[pages] = owner.id
        return pages

    def free(self, pages: PageIds | Sequence[int], owner: Owner) -> None:
        """Return ``owner``'s pages to the free stack."""
        n = len(pages)
        if n == 0:
            return
        ids = self._claim(pages, owner, "free", OwnerKind.FREE, -1)
        top = self._top
        if n == 1:
            self._free[top] = ids[0]
        else:
            self._free[top : top + n] = ids[::-1]
        self._top = top + n

    def transfer(self, pages: PageIds | Sequence[int], old: Owner, new: Owner) -> None:
        """Move pages from ``old`` to ``new`` (a request's pages joining the tree)."""
        if len(pages):
            self._claim(pages, old, "transfer", new.kind, new.id)

    def owner_of(self, page: int) -> Owner | None:
        kind = OwnerKind(int(self.owner_kind[page]))
        return None if kind is OwnerKind.FREE else Owner(kind, int(self.owner_id[page]))

    def _claim(
        self, pages: PageIds | Sequence[int], owner: Owner, verb: str, kind: int, oid: int
    ) -> np.ndarray | list[int]:
        """Check that ``owner`` holds every page named, each named once; then tag
        them ``(kind, oid)``. Otherwise raise ``OwnershipError`` and change nothing.

        How depends on the count, for the cost of numpy calls against Python
        loops: a few pages one by one (``_claim_short``), a few hundred as lists
        (``_check_listed``), more in vectorised passes (``_check_long``; a
        dense run is retagged through the map it was checked on, in memory
        order). Returns the page ids, as a list or an array.
        """
        n = len(pages)
        if n <= SHORT_RUN:
            return self._claim_short(pages, owner, verb, int(kind), oid)
        idx = as_index(pages)
        named = None
        if n <= LISTED_RUN:
            self._check_listed(idx, owner, verb)
        else:
            named = self._check_long(idx, owner, verb)
        if named is None:
            self.owner_kind[idx] = int(kind)
            self.owner_id[idx] = oid
        else:
            np.copyto(self.owner_kind, int(kind), where=named)
            np.copyto(self.owner_id, oid, where=named)
        return idx

    def _claim_short(
        self, pages: PageIds | Sequence[int], owner: Owner, verb: str, kind: int, oid: int
    ) -> list[int]:
        ids = pages.tolist() if isinstance(pages, np.ndarray) else list(pages)
        kinds, oids, cap = self.owner_kind, self.owner_id, self.capacity
        want, wid = int(owner.kind), owner.id  # plain ints: enums compare slowly
        kind_of, id_of = kinds.item, oids.item  # Python ints out, no numpy scalars
        for p in ids:
            if not (0 <= p < cap and kind_of(p) == want and id_of(p) == wid):
                self._refuse(ids, owner, verb)
        if len(ids) > 1 and len(set(ids)) != len(ids):
            self._refuse(ids, owner, verb)
        for p in ids:
            kinds[p] = kind
            oids[p] = oid
        return ids

    def _check_listed(self, idx: np.ndarray, owner: Owner, verb: str) -> None:
        """In range (checked before any gather: a negative id would wrap), tags
        gathered once and counted as Python lists, no id twice (a set)."""
        ids, n = idx.tolist(), idx.size
        if (
            min(ids) < 0
            or max(ids) >= self.capacity
            or self.owner_kind[idx].tolist().count(int(owner.kind)) != n
            or self.owner_id[idx].tolist().count(owner.id) != n
            or len(set(ids)) != n
        ):
            self._refuse(ids, owner, verb)

    def _check_long(self, idx: np.ndarray, owner: Owner, verb: str) -> np.ndarray | None:
        """Every page in range and ``owner``'s, none named twice, without sorting.

        A dense run, naming at least one page in ``DENSE_RUN`` of the pool (a
        flush frees most of it), is checked on a map of the pool: each named
        page marked, fewer marks than pages means one was named twice, and every
        mark must fall on a page ``owner`` holds. Whole-pool passes in memory
        order cost less there than gathering each named page's tags. Returns
        the map (True exactly at the named pages) for the caller's retag.

        A sparser run gathers its pages' tags. Duplicates: each named page's id
        tag is set to a code unique to its position and read back; a page named
        twice reads back one code only, so some position sees another's. The
        tags were all ``owner.id`` (checked first), so they are put back before
        the caller retags or refuses.
        """
        if int(idx.view(np.uint64).max()) >= self.capacity:  # negatives wrap to huge
            self._refuse(idx.tolist(), owner, verb)
        kinds, oids, n = self.owner_kind, self.owner_id, idx.size
        if n * DENSE_RUN >= self.capacity:
            named = np.zeros(self.capacity, dtype=np.bool_)
            named[idx] = True
            named &= kinds == int(owner.kind)
            named &= oids == owner.id
            if int(np.count_nonzero(named)) != n:  # a page named twice, or not owner's
                self._refuse(idx.tolist(), owner, verb)
            return named
        if ((np.take(kinds, idx) != int(owner.kind)) | (np.take(oids, idx) != owner.id)).any():
            self._refuse(idx.tolist(), owner, verb)
        codes = np.arange(-2, -2 - n, -1, dtype=np.int64)
        oids[idx] = codes
        twice = bool((np.take(oids, idx) != codes).any())
        oids[idx] = owner.id
        if twice:
            self._refuse(idx.tolist(), owner, verb)
        return None

    def _refuse(self, ids: list[int], owner: Owner, verb: str) -> NoReturn:
        if any(not 0 <= p < self.capacity for p in ids):
            raise OwnershipError(f"{self.group}: {verb} of page ids outside [0, {self.capacity})")
        bad = [p for p in ids if self.owner_of(p) != owner][:8] or ids[:8]
        held = [str(self.owner_of(p) or "free") for p in bad]
        raise OwnershipError(f"{self.group}: {owner} tried to {verb} pages {bad} held by {held}")

    def view(self) -> PoolSnapshot:
        """The bookkeeping without copies: valid until the pool next changes
        (the audit reads it synchronously)."""
        return PoolSnapshot(
            group=self.group,
            tier=self.tier,
            capacity=self.capacity,
            free_pages=self._free[: self._top],
            owner_kind=self.owner_kind,
            owner_id=self.owner_id,
        )

    def snapshot(self) -> PoolSnapshot:
        return PoolSnapshot(
            group=self.group,
            tier=self.tier,
            capacity=self.capacity,
            free_pages=self._free[: self._top].copy(),
            owner_kind=self.owner_kind.copy(),
            owner_id=self.owner_id.copy(),
        )

    # -- data -----------------------------------------------------------------
    def token_slots(self, pages: PageIds | Sequence[int], start: int, n: int) -> np.ndarray:
        """Flat slot indices of tokens [start, start + n) laid out over ``pages``.

        ``pages[k]`` holds tokens [k * page_size, (k + 1) * page_size) of the
        sequence the caller has in mind; ``start`` is in that coordinate.
        """
        pos = np.arange(start, start + n, dtype=np.int64)
        return as_index(pages)[pos // self.page_size] * self.page_size + pos % self.page_size

    def token_index(self, pages: PageIds | Sequence[int], start: int, n: int) -> torch.Tensor:
        """``token_slots`` as a tensor on the pool's device."""
        return torch.from_numpy(self.token_slots(pages, start, n)).to(self.data.device)

    @property
    def tokens(self) -> torch.Tensor:
        """The data as one row per token slot: (capacity * page_size, *token_shape)."""
        return self._tokens

    def read_tokens(self, pages: PageIds | Sequence[int], start: int, n: int) -> torch.Tensor:
        rows = self._whole_pages(pages, start, n)
        if rows is None:
            return self.tokens[self.token_index(pages, start, n)]
        if self._host is not None:
            return torch.from_numpy(self._host_copy(rows).reshape(n, *self.layout.token_shape))
        return self._get(rows).view(n, *self.layout.token_shape)

    def write_tokens(
        self, pages: PageIds | Sequence[int], start: int, values: torch.Tensor
    ) -> None:
        rows = self._whole_pages(pages, start, values.shape[0])
        if rows is None:
            idx = self.token_index(pages, start, values.shape[0])
            self.tokens[idx] = values.to(device=self.data.device, dtype=self.data.dtype)
        elif self._host is not None:
            self._host[rows] = self._host_values(values).reshape(-1, *self._host.shape[1:])
        else:
            self._put(rows, values.reshape(-1, *self.data.shape[1:]))

    def read_aux(
        self, name: str, pages: PageIds | Sequence[int], start: int, n: int
    ) -> torch.Tensor:
        field = self.aux[name]
        return field.view(-1, *field.shape[2:])[self.token_index(pages, start, n)]

    def write_aux(
        self, name: str, pages: PageIds | Sequence[int], start: int, values: torch.Tensor
    ) -> None:
        field = self.aux[name]
        idx = self.token_index(pages, start, values.shape[0])
        field.view(-1, *field.shape[2:])[idx] = values.to(device=field.device, dtype=field.dtype)

    def page_data(self, pages: PageIds | Sequence[int]) -> torch.Tensor:
        return self._get(self._rows(pages))

    def set_page_data(self, pages: PageIds | Sequence[int], values: torch.Tensor | float) -> None:
        self._put(self._rows(pages), values)

    def copy_pages(self, src: PageIds, dst_pool: PagePool, dst: PageIds) -> None:
        """Copy whole pages into a pool with the same layout (same pool, or a tier move)."""
        if self._host is not None and dst_pool._host is not None:
            dst_pool._host[dst_pool._rows(dst)] = self._host[self._rows(src)]  # overlap-safe
        else:
            dst_pool.set_page_data(dst, self.page_data(src))
        if not self.aux:
            return
        src_idx, dst_idx = torch.from_numpy(as_index(src)), torch.from_numpy(as_index(dst))
        for name, field in self.aux.items():
            target = dst_pool.aux[name]
            target[dst_idx.to(target.device)] = field[src_idx.to(field.device)].to(target.device)

    # Rows of whole pages go through numpy where the data is host memory numpy can
    # read (``_host``, the same memory): a small copy there costs a fraction of a
    # torch indexing call. Elsewhere (another device, bfloat16) torch does it.
    def _rows(self, pages: PageIds | Sequence[int]) -> slice | np.ndarray:
        """The data rows of ``pages``: a slice where the ids run consecutively
        inside the pool (no gather), else the ids."""
        ids = pages.tolist() if isinstance(pages, np.ndarray) else list(pages)
        first = ids[0] if ids else -1
        if first >= 0 and ids[-1] < self.capacity and ids == list(range(first, first + len(ids))):
            return slice(first, first + len(ids))
        return as_index(ids)

    def _get(self, rows: slice | np.ndarray) -> torch.Tensor:
        """A copy of ``rows``, as a tensor on the pool's device."""
        if self._host is not None:
            return torch.from_numpy(self._host_copy(rows))
        if isinstance(rows, slice):
            return self.data[rows].clone()
        return self.data[torch.from_numpy(rows).to(self.data.device)]

    def _put(self, rows: slice | np.ndarray, values: torch.Tensor | float) -> None:
        if self._host is not None:
            self._host[rows] = self._host_values(values)
        elif isinstance(rows, slice):
            self.data[rows] = values
        else:
            self.data[torch.from_numpy(rows).to(self.data.device)] = values

    def _host_copy(self, rows: slice | np.ndarray) -> np.ndarray:
        got = self._host[rows]  # a gather copies; a slice is a view
        return got.copy() if isinstance(rows, slice) else got

    def _host_values(self, values: torch.Tensor | float) -> np.ndarray | float:
        if not isinstance(values, torch.Tensor):
            return values
        if values.dtype is not self.data.dtype:
            values = values.to(self.data.dtype)
        return values.numpy(force=True)  # from any device, detached

    def _whole_pages(
        self, pages: PageIds | Sequence[int], start: int, n: int
    ) -> slice | np.ndarray | None:
        """``_rows`` of the pages that tokens [start, start + n) fill exactly, or
        None where the run starts or ends inside a page (the caller goes by token)."""
        p = self.page_size
        if n <= 0 or start % p or n % p or start < 0 or len(pages) < (start + n) // p:
            return None
        return self._rows(pages[start // p : (start + n) // p])
