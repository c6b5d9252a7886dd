//! Benchmarks of the state store; the targets live in `benches/`.
