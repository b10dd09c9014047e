"""Tests for pdjax.kv.pages: exact allocation order, errors, and random-op invariants."""

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from pdjax.kv.pages import BlockTables, OutOfPages, PageAllocator


def test_allocate_lowest_pages_first():
  a = PageAllocator(8)
  assert a.allocate(3) == [0, 1, 2]
  assert (a.num_pages, a.num_free, a.num_used) == (8, 5, 3)
  a.free([1])
  assert a.allocate(1) == [1]
  a.free([2, 0])
  assert a.allocate(3) == [0, 2, 3]
  assert a.num_free == 4


def test_out_of_pages_allocates_nothing():
  a = PageAllocator(4)
  a.allocate(3)
  assert a.can_allocate(1) and not a.can_allocate(2)
  with pytest.raises(OutOfPages) as e:
    a.allocate(2)
  assert str(e.value) == "need 2 pages, 1 free"
  assert a.num_free == 1
  assert a.allocate(1) == [3]


def test_refcounts_and_double_free():
  a = PageAllocator(4)
  assert a.allocate(2) == [0, 1]
  a.incref([0])
  assert [a.refcount(p) for p in range(4)] == [2, 1, 0, 0]
  a.free([0, 1])
  assert [a.refcount(p) for p in range(4)] == [1, 0, 0, 0]
  assert a.num_free == 3
  with pytest.raises(ValueError) as e:
    a.free([1])
  assert str(e.value) == "page 1 is already free"
  with pytest.raises(ValueError) as e:
    a.incref([2])
  assert str(e.value) == "page 2 is free"
  with pytest.raises(ValueError) as e:  # Validated up front: page 0 stays held.
    a.free([0, 0])
  assert str(e.value) == "page 0 is already free"
  assert a.refcount(0) == 1
  a.free([0])
  assert a.num_free == 4 and a.allocate(4) == [0, 1, 2, 3]


def test_block_tables_allocate_extend_free():
  bt = BlockTables(num_pages=8, page_size=4)
  assert [bt.pages_needed(n) for n in (0, 1, 4, 5, 8, 9)] == [0, 1, 1, 2, 2, 3]
  assert bt.allocate("a", 5) == [0, 1]
  assert bt.allocate("b", 4) == [2]
  assert bt.extend("a", 8) == []
  assert bt.extend("a", 9) == [3]
  assert bt.block_table("a") == [0, 1, 3]
  assert bt.seq_ids == ["a", "b"]
  assert (bt.num_free_pages, bt.num_used_pages) == (4, 4)
  bt.free("a")
  assert bt.seq_ids == ["b"]
  assert bt.allocate("c", 12) == [0, 1, 3]
  assert bt.can_allocate(16) and not bt.can_allocate(17)
  bt.check_invariants()
  assert bt.leaked() == 0


def test_block_tables_errors():
  bt = BlockTables(num_pages=2, page_size=16)
  bt.allocate("a", 16)
  with pytest.raises(ValueError) as e:
    bt.allocate("a", 1)
  assert str(e.value) == "sequence a already has pages"
  with pytest.raises(ValueError) as e:
    bt.free("zzz")
  assert str(e.value) == "unknown sequence zzz"
  with pytest.raises(ValueError) as e:
    bt.extend("zzz", 1)
  assert str(e.value) == "unknown sequence zzz"
  with pytest.raises(OutOfPages) as e:
    bt.extend("a", 48)
  assert str(e.value) == "need 2 pages, 1 free"
  assert bt.block_table("a") == [0]
  with pytest.raises(OutOfPages):
    bt.allocate("b", 33)
  assert bt.seq_ids == ["a"]
  bt.check_invariants()


def test_block_table_is_a_copy():
  bt = BlockTables(num_pages=4, page_size=2)
  bt.allocate("a", 2)
  bt.block_table("a").append(3)
  assert bt.block_table("a") == [0]


def test_leaked_and_invariant_violations():
  bt = BlockTables(num_pages=6, page_size=1)
  bt.allocate("a", 2)
  bt.allocator.allocate(1)  # Used page 2 held by no table.
  assert bt.leaked() == 1
  with pytest.raises(AssertionError, match="page 2 has refcount 1 but 0 live holders"):
    bt.check_invariants()

  bt = BlockTables(num_pages=6, page_size=1)
  bt.allocate("a", 2)
  bt._tables["b"] = [1]  # Page 1 owned twice with refcount 1.
  with pytest.raises(AssertionError, match="page 1 owned 2 times with refcount 1"):
    bt.check_invariants()
  bt.allocator.incref([1])
  with pytest.raises(AssertionError,
                     match="per-sequence page accounting differs from the block tables"):
    bt.check_invariants()  # "b" bypassed allocate: its pages are not accounted for
  bt._held["b"] = (1, 1, "")
  bt.pages_by_owner[""] += 1
  bt.check_invariants()  # Shared prefix page: fine once refcounted.
  bt.num_unused_slots += 1
  with pytest.raises(AssertionError, match="unused slots 1 != 0 recounted"):
    bt.check_invariants()

  bt = BlockTables(num_pages=6, page_size=1)
  bt.allocate("a", 2)
  bt._tables["b"] = [4]
  with pytest.raises(AssertionError,
                     match="free page 4 is reachable from a live block table"):
    bt.check_invariants()

  bt = BlockTables(num_pages=6, page_size=1)
  bt.allocator._free.append(5)  # Page 5 on the free list twice.
  with pytest.raises(AssertionError, match=r"free \(7\) \+ used \(0\) != total \(6\)"):
    bt.check_invariants()


class BlockTablesMachine(RuleBasedStateMachine):
  """Random allocate/extend/free against a model of token counts per sequence."""

  def __init__(self):
    super().__init__()
    self.bt = BlockTables(num_pages=16, page_size=4)
    self.tokens: dict[str, int] = {}
    self.freed_pages: set[int] = set()
    self.next_id = 0

  @rule(num_tokens=st.integers(0, 40))
  def allocate(self, num_tokens):
    seq_id = f"s{self.next_id}"
    self.next_id += 1
    need = -(-num_tokens // 4)
    free_before = self.bt.num_free_pages
    if need > free_before:
      with pytest.raises(OutOfPages):
        self.bt.allocate(seq_id, num_tokens)
      assert self.bt.num_free_pages == free_before
      return
    pages = self.bt.allocate(seq_id, num_tokens)
    assert len(pages) == need
    self.freed_pages -= set(pages)
    self.tokens[seq_id] = num_tokens

  @precondition(lambda self: self.tokens)
  @rule(data=st.data(), grow=st.integers(0, 20))
  def extend(self, data, grow):
    seq_id = data.draw(st.sampled_from(sorted(self.tokens)))
    before = self.bt.block_table(seq_id)
    target = self.tokens[seq_id] + grow
    need = -(-target // 4) - len(before)
    if need > self.bt.num_free_pages:
      with pytest.raises(OutOfPages):
        self.bt.extend(seq_id, target)
      assert self.bt.block_table(seq_id) == before
      return
    new = self.bt.extend(seq_id, target)
    assert len(new) == max(need, 0)
    assert self.bt.block_table(seq_id) == before + new
    self.freed_pages -= set(new)
    self.tokens[seq_id] = target

  @precondition(lambda self: self.tokens)
  @rule(data=st.data())
  def free(self, data):
    seq_id = data.draw(st.sampled_from(sorted(self.tokens)))
    self.freed_pages |= set(self.bt.block_table(seq_id))
    self.bt.free(seq_id)
    del self.tokens[seq_id]

  @invariant()
  def bookkeeping_holds(self):
    self.bt.check_invariants()
    tables = {s: self.bt.block_table(s) for s in self.bt.seq_ids}
    assert sorted(tables) == sorted(self.tokens)
    owned = [p for t in tables.values() for p in t]
    assert len(owned) == len(set(owned)), "a page is owned twice"
    assert self.bt.num_free_pages + self.bt.num_used_pages == 16
    assert self.bt.num_used_pages == len(owned)
    assert not self.freed_pages & set(owned), "a freed page is reachable"
    assert self.bt.leaked() == 0
    for s, t in tables.items():
      assert len(t) == -(-self.tokens[s] // 4)


BlockTablesMachine.TestCase.settings = settings(
    max_examples=100, stateful_step_count=30, deadline=None)
TestBlockTables = BlockTablesMachine.TestCase
