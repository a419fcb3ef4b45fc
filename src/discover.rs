//! Discovery: /proc + probe profiles -> Topology.
