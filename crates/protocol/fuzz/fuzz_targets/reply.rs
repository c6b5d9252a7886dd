//! Any bytes as a reply or notification: decoding never panics, and whatever decodes survives
//! an encode/decode round trip unchanged.
#![no_main]

use libfuzzer_sys::fuzz_target;
use statestore_protocol::{Notification, Response};

fuzz_target!(|data: &[u8]| {
    if let Ok(response) = Response::decode(data) {
        assert_eq!(Response::decode(&response.encode()).as_ref(), Ok(&response));
    }
    if let Some(notification) = Notification::decode(data) {
        assert_eq!(Notification::decode(&notification.encode()).as_ref(), Some(&notification));
    }
});
