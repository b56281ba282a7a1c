"""LinkBypass: links that can never limit a rate (fed by, or feeding, links of no more total capacity)."""

from simulator.engine.bypass import LinkBypass

CAP = {"a": 10.0, "b": 10.0, "c": 10.0, "t": 20.0, "u": 20.0, "x": 10.0, "y": 10.0}


def test_a_trunk_fed_by_links_of_no_more_capacity_is_free():
    bp = LinkBypass(CAP)
    assert bp.observe([("a", "t", "x"), ("b", "t", "y")]) == set()
    # t: entered from a and b (10 + 10 <= 20); a and x start or end routes
    assert bp.free == {"t"}
    assert bp.couplings([("a", "t", "x")]) == [("a", "x")]


def test_a_trunk_leaving_into_links_of_no_more_capacity_is_free():
    bp = LinkBypass(CAP)
    bp.observe([("a", "c", "u", "x"), ("b", "c", "u", "y")])
    # c starts no route and is entered from a, b (20 > 10): binds; u leaves into x, y (20 <= 20)
    assert "u" in bp.free and "c" not in bp.free


def test_a_third_feeder_makes_the_trunk_bind_and_observe_says_so():
    bp = LinkBypass(CAP)
    bp.observe([("a", "t", "x"), ("b", "t", "y")])
    # c enters t too (30 > 20) and u leaves it (x, y, u: 40 > 20)
    assert bp.observe([("c", "t", "u")]) == {"t"}
    assert bp.free == {"u"}  # entered from t only (20 <= 20), which binds
    assert bp.observe([("a", "t", "x")]) == set()  # once binding, for good


def test_a_link_that_starts_or_ends_a_route_is_not_free_on_that_side():
    bp = LinkBypass(CAP)
    bp.observe([("a", "t")])
    assert bp.free == {"t"}  # entered from a only (10 <= 20); a starts the route, t ends it
    assert bp.observe([("t", "b")]) == {"t"}  # now t starts a route too: no side is closed
    bp = LinkBypass(CAP)
    bp.observe([("t", "x")])
    assert bp.free == {"t"}  # t starts the route but leaves into x only (10 <= 20)


def test_two_links_never_justify_each_other_and_every_route_keeps_a_binding_link():
    cap = {"p": 10.0, "q": 10.0}
    bp = LinkBypass(cap)
    bp.observe([("p", "q")])
    # p feeds q (10 <= 10) and q drains p (10 <= 10): each could be free only if the other binds
    assert bp.free == set()
    assert bp.couplings([("p", "q")]) == [("p", "q")]


def test_unknown_links_are_refused():
    bp = LinkBypass(CAP)
    try:
        bp.observe([("a", "zz")])
    except ValueError as err:
        assert "zz" in str(err)
    else:
        raise AssertionError("expected a ValueError")
