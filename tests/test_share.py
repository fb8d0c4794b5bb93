"""runtime.ShareSampler and runtime.ShareStream (issue 22, item 5), in one process with explicit
ranks; the inline twins of --standalone against them. The 2-rank runs are tests/test_e2e_share.py.

What is proven: each rank's share of a WeightedRandomSampler over an imbalanced set keeps the
weights (the class ratio each rank sees is the one the weights ask for), the shares dealt back
together are exactly the single-process draw with the same seed, every rank gets the same number
of indices, every pass draws anew, the script's random streams are left as they were, and a stream
is dealt out item by item, per DataLoader worker when the dataset splits itself among workers.
"""
from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest
import torch
from torch.utils.data import BatchSampler, DataLoader, IterableDataset, SubsetRandomSampler, WeightedRandomSampler

from distify.runtime import ShareSampler, ShareStream

sys.path.insert(0, str(Path(__file__).resolve().parent))

from test_standalone import inline_runtime  # noqa: E402

# 900 of class 0, 100 of class 1; weights that ask for both classes equally often
LABELS = torch.tensor([0] * 900 + [1] * 100)
WEIGHTS = torch.where(LABELS == 0, 1 / 900, 1 / 100).double()
DRAWS = 4000
SEED = 17


def _weighted() -> WeightedRandomSampler:
    return WeightedRandomSampler(WEIGHTS, DRAWS, replacement=True)


def _shares(make, replicas: int, epoch: int = 0, **kwargs) -> list:
    out = []
    for rank in range(replicas):
        share = ShareSampler(make(), num_replicas=replicas, rank=rank, seed=SEED, **kwargs)
        share.set_epoch(epoch)
        out.append(list(share))
    return out


@pytest.mark.parametrize("replicas", [2, 3])
def test_each_rank_sees_the_class_balance_the_weights_ask_for(replicas):
    shares = _shares(_weighted, replicas)
    for share in shares:
        ratio = LABELS[share].float().mean().item()
        assert abs(ratio - 0.5) < 0.05, f"class-1 ratio {ratio:.3f} on one rank; the weights ask for 0.5"
    # dealt back together: the single-process draw with the same seed, in its order
    torch.manual_seed(SEED)
    single = list(_weighted())
    dealt = [shares[i % replicas][i // replicas] for i in range(DRAWS)]
    assert dealt == single
    # a plain stride over the unweighted indices would see the set's own 10% (the control of the ratio)
    assert abs(LABELS[list(range(0, 1000, replicas))].float().mean().item() - 0.1) < 0.01


def test_every_rank_takes_the_same_number_padded_or_cut():
    sub = lambda: SubsetRandomSampler(list(range(11)))  # noqa: E731
    padded = _shares(sub, 3)
    assert [len(s) for s in padded] == [4, 4, 4]
    assert sorted(x for s in padded for x in s) == sorted(list(range(11)) + padded[0][:1])  # one sample twice
    cut = _shares(sub, 3, drop_last=True)
    assert [len(s) for s in cut] == [3, 3, 3] and len({x for s in cut for x in s}) == 9
    assert len(ShareSampler(sub(), 3, 0, seed=0)) == 4 and len(ShareSampler(sub(), 3, 0, seed=0, drop_last=True)) == 3


def test_a_batch_sampler_is_dealt_out_batch_by_batch():
    make = lambda: BatchSampler(SubsetRandomSampler(list(range(20))), 4, drop_last=False)  # noqa: E731
    shares = _shares(make, 2)
    assert [len(s) for s in shares] == [3, 3] and all(len(b) == 4 for s in shares for b in s[:2])
    torch.manual_seed(SEED)
    single = list(make())
    assert shares[0] == single[0::2] and shares[1] == single[1::2] + single[:1]  # 5 batches: padded to 6


def test_every_pass_draws_anew_and_the_epoch_decides():
    share = ShareSampler(_weighted(), 2, 0, seed=SEED)
    first, second = list(share), list(share)  # no set_epoch: the passes are counted
    assert first != second
    share.set_epoch(0)
    assert list(share) == first


def test_without_a_seed_the_draw_follows_the_scripts_torch_seed_and_leaves_its_streams_alone():
    torch.manual_seed(3)
    random.seed(3)
    a = list(ShareSampler(_weighted(), 2, 0))
    after = (torch.rand(1), random.random())
    torch.manual_seed(3)
    random.seed(3)
    b = list(ShareSampler(_weighted(), 2, 1))
    assert len(set(zip(a, b))) > 1 and a != b  # rank 1 got the other half of the same draw ...
    torch.manual_seed(3)
    random.seed(3)
    assert list(ShareSampler(_weighted(), 2, 0)) == a  # ... which the script's seed reproduces
    # one number was taken from torch's generator for the seed; Python's stream is untouched
    torch.manual_seed(3)
    random.seed(3)
    torch.randint(0, 2**62, (), dtype=torch.int64)
    assert torch.equal(torch.rand(1), after[0]) and random.random() == after[1]


def test_the_samplers_own_generator_is_its_seed_and_is_put_back():
    g = torch.Generator().manual_seed(99)
    state = g.get_state()
    share = ShareSampler(WeightedRandomSampler(WEIGHTS, 50, generator=g), 2, 1)
    got = list(share)
    assert torch.equal(g.get_state(), state)
    original = list(WeightedRandomSampler(WEIGHTS, 50, generator=torch.Generator().manual_seed(99)))
    assert got == original[1::2], "the first pass deals out what the original drew"


def test_a_sampler_of_endless_draws_is_dealt_out_without_holding_it():
    """minGPT's RandomSampler(replacement=True, num_samples=int(1e10)): the share is drawn a chunk
    at a time (the old ShareSampler built list(sampler) first: MemoryError, even in one process)."""
    import itertools

    from torch.utils.data import RandomSampler

    make = lambda: RandomSampler(range(50), replacement=True, num_samples=int(1e10))  # noqa: E731
    heads = [list(itertools.islice(iter(ShareSampler(make(), 2, r, seed=SEED)), 5000)) for r in range(2)]
    torch.manual_seed(SEED)
    single = list(itertools.islice(iter(make()), 10000))
    assert heads[0] == single[0::2] and heads[1] == single[1::2]
    assert len(ShareSampler(make(), 2, 0, seed=SEED)) == 5 * 10**9


@pytest.mark.parametrize("kept_apart", [True, False])
def test_a_pass_drawn_in_chunks_is_the_one_draw_whatever_the_script_draws_between(monkeypatch, kept_apart):
    """Chunks of 3 per rank, the script drawing from torch's and Python's generators between every
    element: the shares are still the single draw's. Control: a draw state that does not put the
    script's streams back (nor keep its own) makes the chunks after the first draw from the script's."""
    import distify.runtime as rt

    monkeypatch.setattr(rt, "_DRAW_CHUNK", 3)
    if not kept_apart:
        monkeypatch.setattr(rt._DrawState, "__exit__", lambda self, *exc: None)
        monkeypatch.setattr(rt._DrawState, "_put", lambda self, states: None)

    class EachDraw(torch.utils.data.Sampler):
        """A script's own sampler that draws each index when asked, from the global streams."""

        def __iter__(self):
            for i in range(40):
                yield int(torch.randint(0, 1000, ())) if i % 2 else random.randrange(1000)

        def __len__(self):
            return 40

    shares = []
    for rank in range(2):
        out = []
        for index in ShareSampler(EachDraw(), 2, rank, seed=SEED):
            out.append(index)
            torch.rand(3), random.random()  # the script's own draws (augmentation, dropout)
        shares.append(out)
    torch.manual_seed(SEED)
    random.seed(SEED)
    single = list(EachDraw())
    assert (shares[0] == single[0::2] and shares[1] == single[1::2]) == kept_apart


class Numbers(IterableDataset):
    def __init__(self, n, split_workers=False):
        self.n, self.split_workers = n, split_workers

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        items = range(self.n)
        if self.split_workers and info is not None:
            items = items[info.id::info.num_workers]
        return iter(items)


def test_a_stream_is_dealt_out_item_by_item_and_evenly():
    shares = [list(ShareStream(Numbers(11), 2, r)) for r in range(2)]
    assert shares == [[0, 2, 4, 6, 8], [1, 3, 5, 7, 9]]  # the 11th item would give rank 0 one step more
    assert len(ShareStream(range(11), 2, 0)) == 5
    assert ShareStream(Numbers(4), 2, 0).n == 4  # the dataset's attributes stay readable


def test_a_stream_that_splits_itself_among_workers_keeps_doing_so():
    def read(rank):
        loader = DataLoader(ShareStream(Numbers(40, split_workers=True), 2, rank), batch_size=None, num_workers=2)
        return [int(x) for x in loader]

    shares = [read(0), read(1)]
    assert len(shares[0]) == len(shares[1]) == 20
    assert sorted(shares[0] + shares[1]) == list(range(40)), "the ranks together read the stream once"


@pytest.mark.parametrize("backend", ["ddp", "horovod"])
def test_inline_share_helpers_deal_out_as_the_runtime_does(backend):
    for rank in range(3):
        env = {"RANK": str(rank), "WORLD_SIZE": "3", "HOROVOD_RANK": str(rank), "HOROVOD_SIZE": "3"}
        inline = inline_runtime(backend, env)
        for drop_last in (False, True):
            got = inline.ShareSampler(_weighted(), seed=SEED, drop_last=drop_last)
            want = ShareSampler(_weighted(), 3, rank, seed=SEED, drop_last=drop_last)
            assert list(got) == list(want) and len(got) == len(want)
        assert list(inline.ShareStream(Numbers(11))) == list(ShareStream(Numbers(11), 3, rank))
