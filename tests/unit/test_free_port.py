"""free_port: ports for children to listen on."""

from __future__ import annotations

from warmfleet.processes import PRIVATE_PORTS_FROM, _ephemeral_low, free_port


def test_ports_are_below_the_ephemeral_range_and_never_handed_out_twice() -> None:
    # 1,500 draws from ~12,000 ports: without the record of ports handed out, about 90 pairs
    # would be equal (a cluster's kvstore and gateway once got the same one)
    ports = [free_port() for _ in range(1500)]
    assert len(set(ports)) == len(ports)
    if _ephemeral_low() > PRIVATE_PORTS_FROM + 1000:  # else the kernel picks them
        assert all(PRIVATE_PORTS_FROM <= p < _ephemeral_low() for p in ports)
