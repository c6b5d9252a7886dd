#![doc = include_str!("getting-started.md")]
