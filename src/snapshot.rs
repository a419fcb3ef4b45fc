//! Building the snapshot (contract) from the model and writing the bundle atomically.
