//! The HPACK Huffman code (RFC 7541, Appendix B).
//!
//! The code is canonical: sorted by (length, symbol), each code is the previous one plus one,
//! shifted left when the length grows. So decoding needs only, per length, the first code and
//! where its symbols start in the sorted list; both are computed at compile time.

/// Code (aligned to the least significant bit) and length in bits of each symbol; 256 is EOS.
const CODES: [(u32, u8); 257] = [
    (0x1ff8, 13),
    (0x7fffd8, 23),
    (0xfffffe2, 28),
    (0xfffffe3, 28),
    (0xfffffe4, 28),
    (0xfffffe5, 28),
    (0xfffffe6, 28),
    (0xfffffe7, 28),
    (0xfffffe8, 28),
    (0xffffea, 24),
    (0x3ffffffc, 30),
    (0xfffffe9, 28),
    (0xfffffea, 28),
    (0x3ffffffd, 30),
    (0xfffffeb, 28),
    (0xfffffec, 28),
    (0xfffffed, 28),
    (0xfffffee, 28),
    (0xfffffef, 28),
    (0xffffff0, 28),
    (0xffffff1, 28),
    (0xffffff2, 28),
    (0x3ffffffe, 30),
    (0xffffff3, 28),
    (0xffffff4, 28),
    (0xffffff5, 28),
    (0xffffff6, 28),
    (0xffffff7, 28),
    (0xffffff8, 28),
    (0xffffff9, 28),
    (0xffffffa, 28),
    (0xffffffb, 28),
    (0x14, 6),
    (0x3f8, 10),
    (0x3f9, 10),
    (0xffa, 12),
    (0x1ff9, 13),
    (0x15, 6),
    (0xf8, 8),
    (0x7fa, 11),
    (0x3fa, 10),
    (0x3fb, 10),
    (0xf9, 8),
    (0x7fb, 11),
    (0xfa, 8),
    (0x16, 6),
    (0x17, 6),
    (0x18, 6),
    (0x0, 5),
    (0x1, 5),
    (0x2, 5),
    (0x19, 6),
    (0x1a, 6),
    (0x1b, 6),
    (0x1c, 6),
    (0x1d, 6),
    (0x1e, 6),
    (0x1f, 6),
    (0x5c, 7),
    (0xfb, 8),
    (0x7ffc, 15),
    (0x20, 6),
    (0xffb, 12),
    (0x3fc, 10),
    (0x1ffa, 13),
    (0x21, 6),
    (0x5d, 7),
    (0x5e, 7),
    (0x5f, 7),
    (0x60, 7),
    (0x61, 7),
    (0x62, 7),
    (0x63, 7),
    (0x64, 7),
    (0x65, 7),
    (0x66, 7),
    (0x67, 7),
    (0x68, 7),
    (0x69, 7),
    (0x6a, 7),
    (0x6b, 7),
    (0x6c, 7),
    (0x6d, 7),
    (0x6e, 7),
    (0x6f, 7),
    (0x70, 7),
    (0x71, 7),
    (0x72, 7),
    (0xfc, 8),
    (0x73, 7),
    (0xfd, 8),
    (0x1ffb, 13),
    (0x7fff0, 19),
    (0x1ffc, 13),
    (0x3ffc, 14),
    (0x22, 6),
    (0x7ffd, 15),
    (0x3, 5),
    (0x23, 6),
    (0x4, 5),
    (0x24, 6),
    (0x5, 5),
    (0x25, 6),
    (0x26, 6),
    (0x27, 6),
    (0x6, 5),
    (0x74, 7),
    (0x75, 7),
    (0x28, 6),
    (0x29, 6),
    (0x2a, 6),
    (0x7, 5),
    (0x2b, 6),
    (0x76, 7),
    (0x2c, 6),
    (0x8, 5),
    (0x9, 5),
    (0x2d, 6),
    (0x77, 7),
    (0x78, 7),
    (0x79, 7),
    (0x7a, 7),
    (0x7b, 7),
    (0x7ffe, 15),
    (0x7fc, 11),
    (0x3ffd, 14),
    (0x1ffd, 13),
    (0xffffffc, 28),
    (0xfffe6, 20),
    (0x3fffd2, 22),
    (0xfffe7, 20),
    (0xfffe8, 20),
    (0x3fffd3, 22),
    (0x3fffd4, 22),
    (0x3fffd5, 22),
    (0x7fffd9, 23),
    (0x3fffd6, 22),
    (0x7fffda, 23),
    (0x7fffdb, 23),
    (0x7fffdc, 23),
    (0x7fffdd, 23),
    (0x7fffde, 23),
    (0xffffeb, 24),
    (0x7fffdf, 23),
    (0xffffec, 24),
    (0xffffed, 24),
    (0x3fffd7, 22),
    (0x7fffe0, 23),
    (0xffffee, 24),
    (0x7fffe1, 23),
    (0x7fffe2, 23),
    (0x7fffe3, 23),
    (0x7fffe4, 23),
    (0x1fffdc, 21),
    (0x3fffd8, 22),
    (0x7fffe5, 23),
    (0x3fffd9, 22),
    (0x7fffe6, 23),
    (0x7fffe7, 23),
    (0xffffef, 24),
    (0x3fffda, 22),
    (0x1fffdd, 21),
    (0xfffe9, 20),
    (0x3fffdb, 22),
    (0x3fffdc, 22),
    (0x7fffe8, 23),
    (0x7fffe9, 23),
    (0x1fffde, 21),
    (0x7fffea, 23),
    (0x3fffdd, 22),
    (0x3fffde, 22),
    (0xfffff0, 24),
    (0x1fffdf, 21),
    (0x3fffdf, 22),
    (0x7fffeb, 23),
    (0x7fffec, 23),
    (0x1fffe0, 21),
    (0x1fffe1, 21),
    (0x3fffe0, 22),
    (0x1fffe2, 21),
    (0x7fffed, 23),
    (0x3fffe1, 22),
    (0x7fffee, 23),
    (0x7fffef, 23),
    (0xfffea, 20),
    (0x3fffe2, 22),
    (0x3fffe3, 22),
    (0x3fffe4, 22),
    (0x7ffff0, 23),
    (0x3fffe5, 22),
    (0x3fffe6, 22),
    (0x7ffff1, 23),
    (0x3ffffe0, 26),
    (0x3ffffe1, 26),
    (0xfffeb, 20),
    (0x7fff1, 19),
    (0x3fffe7, 22),
    (0x7ffff2, 23),
    (0x3fffe8, 22),
    (0x1ffffec, 25),
    (0x3ffffe2, 26),
    (0x3ffffe3, 26),
    (0x3ffffe4, 26),
    (0x7ffffde, 27),
    (0x7ffffdf, 27),
    (0x3ffffe5, 26),
    (0xfffff1, 24),
    (0x1ffffed, 25),
    (0x7fff2, 19),
    (0x1fffe3, 21),
    (0x3ffffe6, 26),
    (0x7ffffe0, 27),
    (0x7ffffe1, 27),
    (0x3ffffe7, 26),
    (0x7ffffe2, 27),
    (0xfffff2, 24),
    (0x1fffe4, 21),
    (0x1fffe5, 21),
    (0x3ffffe8, 26),
    (0x3ffffe9, 26),
    (0xffffffd, 28),
    (0x7ffffe3, 27),
    (0x7ffffe4, 27),
    (0x7ffffe5, 27),
    (0xfffec, 20),
    (0xfffff3, 24),
    (0xfffed, 20),
    (0x1fffe6, 21),
    (0x3fffe9, 22),
    (0x1fffe7, 21),
    (0x1fffe8, 21),
    (0x7ffff3, 23),
    (0x3fffea, 22),
    (0x3fffeb, 22),
    (0x1ffffee, 25),
    (0x1ffffef, 25),
    (0xfffff4, 24),
    (0xfffff5, 24),
    (0x3ffffea, 26),
    (0x7ffff4, 23),
    (0x3ffffeb, 26),
    (0x7ffffe6, 27),
    (0x3ffffec, 26),
    (0x3ffffed, 26),
    (0x7ffffe7, 27),
    (0x7ffffe8, 27),
    (0x7ffffe9, 27),
    (0x7ffffea, 27),
    (0x7ffffeb, 27),
    (0xffffffe, 28),
    (0x7ffffec, 27),
    (0x7ffffed, 27),
    (0x7ffffee, 27),
    (0x7ffffef, 27),
    (0x7fffff0, 27),
    (0x3ffffee, 26),
    (0x3fffffff, 30),
];

const EOS: u16 = 256;
const MAX_LEN: usize = 30;

struct Canonical {
    /// Symbols sorted by (code length, symbol).
    sorted: [u16; 257],
    /// Per length: the first code of that length and its position in `sorted`.
    first_code: [u32; MAX_LEN + 1],
    first_index: [u16; MAX_LEN + 1],
    count: [u16; MAX_LEN + 1],
}

const fn canonical() -> Canonical {
    let mut count = [0u16; MAX_LEN + 1];
    let mut s = 0;
    while s < 257 {
        count[CODES[s].1 as usize] += 1;
        s += 1;
    }
    let mut first_index = [0u16; MAX_LEN + 1];
    let mut first_code = [0u32; MAX_LEN + 1];
    let mut sorted = [0u16; 257];
    let mut next = 0u16;
    let mut len = 1;
    while len <= MAX_LEN {
        first_index[len] = next;
        let mut first = u32::MAX;
        let mut s = 0;
        while s < 257 {
            if CODES[s].1 as usize == len {
                sorted[next as usize] = s as u16;
                next += 1;
                if CODES[s].0 < first {
                    first = CODES[s].0;
                }
            }
            s += 1;
        }
        first_code[len] = first;
        len += 1;
    }
    Canonical {
        sorted,
        first_code,
        first_index,
        count,
    }
}

const TABLE: Canonical = canonical();

/// The length in bytes of `input` Huffman-coded.
pub fn encoded_len(input: &[u8]) -> usize {
    let bits: usize = input.iter().map(|&b| CODES[b as usize].1 as usize).sum();
    bits.div_ceil(8)
}

/// Appends `input` Huffman-coded to `out`, padded with the most significant bits of EOS (ones).
pub fn encode(input: &[u8], out: &mut Vec<u8>) {
    let mut acc: u64 = 0;
    let mut bits = 0u32;
    for &byte in input {
        let (code, len) = CODES[byte as usize];
        acc = (acc << len) | u64::from(code);
        bits += u32::from(len);
        while bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
        }
        acc &= (1u64 << bits) - 1;
    }
    if bits > 0 {
        let pad = 8 - bits;
        out.push(((acc << pad) | ((1 << pad) - 1)) as u8);
    }
}

/// Why a Huffman-coded string was not decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DecodeError {
    /// Not a valid coding: the HPACK error.
    Invalid,
    /// It decodes to more than the caller allows.
    TooLong,
}

/// Decodes a Huffman-coded string of at most `max_len` bytes, stopping at the first byte past
/// that, so that a short coding of a long string never costs more than `max_len`. EOS inside
/// the string and padding that is longer than 7 bits or not all ones are errors (RFC 7541, 5.2).
pub fn decode(input: &[u8], out: &mut Vec<u8>, max_len: usize) -> Result<(), DecodeError> {
    let start = out.len();
    let mut code: u32 = 0;
    let mut len = 0usize;
    for &byte in input {
        for shift in (0..8).rev() {
            code = (code << 1) | u32::from((byte >> shift) & 1);
            len += 1;
            let offset = code.wrapping_sub(TABLE.first_code[len]);
            if offset < u32::from(TABLE.count[len]) {
                let symbol = TABLE.sorted[(TABLE.first_index[len] as u32 + offset) as usize];
                if symbol == EOS {
                    return Err(DecodeError::Invalid);
                }
                if out.len() - start == max_len {
                    return Err(DecodeError::TooLong);
                }
                out.push(symbol as u8);
                code = 0;
                len = 0;
            } else if len == MAX_LEN {
                return Err(DecodeError::Invalid);
            }
        }
    }
    if len > 7 || code != (1 << len) - 1 {
        return Err(DecodeError::Invalid);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip(input: &[u8]) {
        let mut coded = Vec::new();
        encode(input, &mut coded);
        assert_eq!(coded.len(), encoded_len(input));
        let mut decoded = Vec::new();
        decode(&coded, &mut decoded, usize::MAX).unwrap();
        assert_eq!(decoded, input);
    }

    #[test]
    fn every_byte_round_trips() {
        let all: Vec<u8> = (0..=255).collect();
        round_trip(&all);
        for byte in 0..=255u8 {
            round_trip(&[byte]);
            round_trip(&[byte, b'a', byte]);
        }
        round_trip(b"");
    }

    #[test]
    fn rfc7541_c4_strings() {
        let cases: [(&str, &[u8]); 4] = [
            (
                "www.example.com",
                &[
                    0xf1, 0xe3, 0xc2, 0xe5, 0xf2, 0x3a, 0x6b, 0xa0, 0xab, 0x90, 0xf4, 0xff,
                ],
            ),
            ("no-cache", &[0xa8, 0xeb, 0x10, 0x64, 0x9c, 0xbf]),
            (
                "custom-key",
                &[0x25, 0xa8, 0x49, 0xe9, 0x5b, 0xa9, 0x7d, 0x7f],
            ),
            (
                "custom-value",
                &[0x25, 0xa8, 0x49, 0xe9, 0x5b, 0xb8, 0xe8, 0xb4, 0xbf],
            ),
        ];
        for (text, coded) in cases {
            let mut out = Vec::new();
            encode(text.as_bytes(), &mut out);
            assert_eq!(out, coded, "{text}");
            let mut decoded = Vec::new();
            decode(coded, &mut decoded, usize::MAX).unwrap();
            assert_eq!(decoded, text.as_bytes());
        }
    }

    #[test]
    fn output_stops_at_max_len() {
        // 'a' takes 5 bits: 1 000 of them code to 625 bytes.
        let mut coded = Vec::new();
        encode(&[b'a'; 1000], &mut coded);
        let mut out = b"xy".to_vec();
        assert_eq!(decode(&coded, &mut out, 999), Err(DecodeError::TooLong));
        // Nothing past the limit was written, counted from where the string starts.
        assert_eq!(out.len(), 2 + 999);
        let mut out = Vec::new();
        decode(&coded, &mut out, 1000).unwrap();
        assert_eq!(out, [b'a'; 1000]);
    }

    #[test]
    fn bad_padding_and_eos_are_errors() {
        // 'a' is 00011 (5 bits): padded with 000 instead of 111.
        assert!(decode(&[0b0001_1000], &mut Vec::new(), usize::MAX).is_err());
        // A full byte of padding after a symbol that ends on a byte boundary.
        let mut coded = Vec::new();
        encode(b"0a1", &mut coded); // 5 + 5 + 5 bits, then 1 bit of padding.
        coded.push(0xff);
        assert!(decode(&coded, &mut Vec::new(), usize::MAX).is_err());
        // EOS (30 ones) as a symbol.
        assert!(decode(&[0xff, 0xff, 0xff, 0xff], &mut Vec::new(), usize::MAX).is_err());
        // Truncated in the middle of a long code: 13 bits of '\0' cut after 8.
        assert!(decode(&[0b1111_1111, 0b1100_0000], &mut Vec::new(), usize::MAX).is_err());
    }
}
