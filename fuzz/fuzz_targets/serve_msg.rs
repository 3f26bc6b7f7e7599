//! The policy server's request path without a socket: a websocket message's bytes decoded as
//! msgpack-numpy (`serve::msgpack_numpy::decode`) and mapped to policy inputs by each preset key
//! map (`Mapping::parse`, LIBERO, ALOHA, DROID and the generic one), as `flashrt serve` does
//! before it steps. Both must return Ok or Err, never panic or allocate without bound; a parsed
//! request's frames must hold the bytes their geometry says.
//!
//! Input: the message bytes.

#![no_main]

use flashrt::serve::mapping::{KeyMap, Limits, Mapping};
use flashrt::serve::msgpack_numpy::decode;
use libfuzzer_sys::fuzz_target;

/// The cameras and state width of the synthesized Pi0.5 the server tests serve.
const CAMERAS: [&str; 3] = ["observation.images.base_0_rgb", "observation.images.left_wrist_0_rgb", "observation.images.right_wrist_0_rgb"];
const STATE_DIM: usize = 8;

fuzz_target!(|data: &[u8]| {
    let Ok(value) = decode(data) else { return };
    let cameras: Vec<String> = CAMERAS.iter().map(|c| c.to_string()).collect();
    for map in [KeyMap::libero(), KeyMap::aloha(), KeyMap::droid(), KeyMap::generic(&cameras)] {
        let Ok(mapping) = Mapping::resolve(&map, &cameras, STATE_DIM) else { continue };
        if let Ok(request) = mapping.parse(&value, Limits { max_array_bytes: 1 << 20 }) {
            for image in request.frames.iter().flatten() {
                assert_eq!(image.data.len(), image.width * image.height * 3, "a parsed frame holds its packed RGB8 rows");
            }
            assert!(request.state.len() <= STATE_DIM * 4, "state of {} values", request.state.len());
        }
    }
});
