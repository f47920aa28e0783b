//! Redis key names and cluster hash slots.

/// The part of `key` Redis Cluster hashes: the text between the first `{` and the next `}` when
/// that is not empty, else the whole key.
pub(crate) fn hash_tag(key: &[u8]) -> &[u8] {
    if let Some(open) = key.iter().position(|&b| b == b'{') {
        if let Some(len) = key[open + 1..].iter().position(|&b| b == b'}') {
            if len > 0 {
                return &key[open + 1..open + 1 + len];
            }
        }
    }
    key
}

/// The cluster slot of `key` (CRC16-XMODEM of its hash tag, mod 16384), as Redis computes it.
pub(crate) fn slot(key: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &b in hash_tag(key) {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 { (crc << 1) ^ 0x1021 } else { crc << 1 };
        }
    }
    crc & 0x3fff
}

/// The Redis key of `key` on the layer named `layer`: `{prefix}{layer}:{key}` when the key
/// carries its own hash tag, else `{prefix}{layer}:{{key}}`, so that one key's state on every
/// layer sits in one slot.
pub(crate) fn redis_key(prefix: &str, layer: &str, key: &str) -> String {
    let tagged = hash_tag(key.as_bytes()).len() != key.len();
    let mut out = String::with_capacity(prefix.len() + layer.len() + key.len() + 3);
    out.push_str(prefix);
    out.push_str(layer);
    out.push(':');
    if tagged {
        out.push_str(key);
    } else {
        out.push('{');
        out.push_str(key);
        out.push('}');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_match_redis() {
        // Values from `CLUSTER KEYSLOT`.
        assert_eq!(slot(b"foo"), 12182);
        assert_eq!(slot(b"{user1000}.following"), slot(b"{user1000}.followers"));
        assert_eq!(slot(b"123456789"), 0x31c3 & 0x3fff);
        assert_eq!(hash_tag(b"a{}b"), b"a{}b");
        assert_eq!(hash_tag(b"a{b}{c}"), b"b");
    }

    #[test]
    fn a_key_sits_in_one_slot_on_every_layer() {
        let a = redis_key("rw:", "ip", "alice");
        let b = redis_key("rw:", "day", "alice");
        assert_eq!(a, "rw:ip:{alice}");
        assert_eq!(slot(a.as_bytes()), slot(b.as_bytes()));
        assert_eq!(redis_key("rw:", "ip", "{t}:alice"), "rw:ip:{t}:alice");
    }
}
