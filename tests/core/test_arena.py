"""NOTE [ Planned allocation ]: offsets that never overlap for requests live at the same time, an arena never
below the most bytes live at once, and never above what an allocator without a plan needs."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from torch_dtr.core.arena import Plan, Request, check, contention, first_fit, max_live, plan


@st.composite
def _requests(draw) -> list[Request]:
    n = draw(st.integers(0, 40))
    out = []
    for _ in range(n):
        start = draw(st.integers(0, 60))
        out.append(Request(start, start + draw(st.integers(1, 30)), draw(st.sampled_from([0, 1, 3, 8, 64, 100]))))
    return out


@settings(max_examples=300, deadline=None, derandomize=True)
@given(_requests())
def test_a_plan_never_overlaps_live_requests_and_lies_between_the_lower_bound_and_first_fit(requests):
    p = plan(requests)
    check(requests, p)
    online = first_fit(requests)
    check(requests, online)
    assert max_live(requests) <= p.size <= online.size


def test_requests_that_never_live_together_share_their_bytes():
    requests = [Request(0, 2, 100), Request(2, 4, 60), Request(4, 6, 80)]
    assert max_live(requests) == 100 and plan(requests).size == 100


def test_the_plan_beats_first_fit_where_a_hole_is_left_behind():
    # first fit puts the long-lived 64 above the short 32, whose hole the later 64 cannot use
    requests = [Request(0, 2, 32), Request(1, 10, 64), Request(3, 10, 64)]
    assert first_fit(requests).size == 160
    assert plan(requests).size == 128 == max_live(requests)


def test_check_catches_an_overlap_and_a_request_is_refused_when_malformed():
    requests = [Request(0, 4, 10), Request(2, 6, 10)]
    with pytest.raises(AssertionError, match="overlaps request"):
        check(requests, Plan([0, 5], 15))
    with pytest.raises(ValueError, match="0 <= start < end"):
        Request(3, 3, 8)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(_requests())
def test_contention_is_the_most_bytes_live_during_each_requests_lifetime(requests):
    def live(t: int) -> int:
        return sum(r.size for r in requests if r.start <= t < r.end)

    assert contention(requests) == [max(live(t) for t in range(r.start, r.end)) for r in requests]
