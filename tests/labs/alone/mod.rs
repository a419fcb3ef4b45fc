//! The lab tests whose wedgewatch (or discovery) sees every stack on the machine: discovery
//! itself on live processes, and the labs of several nodes (network namespaces, fleets,
//! an exporter per node), whose wedgewatch runs inside a node. Each takes
//! `lab::exclusive()` first: the tests of one file run side by side, apart from every other
//! test that starts a stack.

mod discovery;
mod exporter_lab;
mod fleet_lab;
mod netns_lab;
mod router_key_lookalikes;
mod two_node_lab;
