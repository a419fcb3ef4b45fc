//! The sampler's policy, apart from its mechanism (`sampler`): what is suspected, from the
//! correlator's view and the detectors' findings ([`suspicion`]), and which processes the
//! stacks source dumps because of it ([`stacks`]).

pub mod stacks;
pub mod suspicion;
