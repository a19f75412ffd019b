//! The BPF cookie attached to every probe. It tells the one shared program
//! which MPI function it sits on and how to find that call's byte figures, so
//! a probe hit needs no lookup to learn what it is.
//!
//! Layout (u64): bits 0..16 function ID; bits 16..32 and 32..48 two
//! [`BytePart`] slots of 16 bits each: argument positions of buffer, count and
//! datatype (4 bits each), direction (1 bit), count kind (2 bits) and
//! "may be `MPI_IN_PLACE`" (1 bit).

use crate::functions::{BytePart, CountKind, Direction, Family, FunctionInfo};

/// A decoded byte part, as the probe uses it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Part {
    /// Argument position of the buffer.
    pub buf: u32,
    /// Argument position of the count.
    pub count: u32,
    /// Argument position of the datatype.
    pub datatype: u32,
    /// 0 = send, 1 = recv.
    pub direction: u32,
    /// [`CountKind`] as a number.
    pub kind: u32,
    /// The buffer may be `MPI_IN_PLACE`, in which case the part moves no data.
    pub in_place_ok: bool,
}

const PART_BITS: u32 = 16;

/// Encodes one part; arguments past position 15 cannot be encoded.
const fn encode_part(p: &BytePart, collective: bool) -> u64 {
    if matches!(p.kind, CountKind::None) {
        return 0;
    }
    (p.buf as u64 & 0xf)
        | ((p.count as u64 & 0xf) << 4)
        | ((p.datatype as u64 & 0xf) << 8)
        | ((p.direction as u64 & 1) << 12)
        | ((p.kind as u64 & 3) << 13)
        | ((collective as u64) << 15)
}

/// The cookie for a function; `with_bytes` is false when byte accounting is
/// not wanted for this attachment.
pub const fn encode(id: u16, info: &FunctionInfo, with_bytes: bool) -> u64 {
    let mut c = id as u64;
    if with_bytes {
        let collective = matches!(info.family, Family::Collective);
        c |= encode_part(&info.bytes[0], collective) << PART_BITS;
        c |= encode_part(&info.bytes[1], collective) << (2 * PART_BITS);
    }
    c
}

/// The function ID in a cookie.
#[inline(always)]
pub const fn function(cookie: u64) -> u32 {
    (cookie & 0xffff) as u32
}

/// Byte part `i` (0 or 1) of a cookie, if that slot is used.
#[inline(always)]
pub const fn part(cookie: u64, i: u32) -> Option<Part> {
    let raw = (cookie >> (PART_BITS * (i + 1))) & 0xffff;
    let kind = ((raw >> 13) & 3) as u32;
    if kind == CountKind::None as u32 {
        return None;
    }
    Some(Part {
        buf: (raw & 0xf) as u32,
        count: ((raw >> 4) & 0xf) as u32,
        datatype: ((raw >> 8) & 0xf) as u32,
        direction: ((raw >> 12) & 1) as u32,
        kind,
        in_place_ok: (raw >> 15) & 1 == 1,
    })
}

/// Whether the cookie asks for any byte accounting.
#[inline(always)]
pub const fn has_bytes(cookie: u64) -> bool {
    cookie >> PART_BITS != 0
}

/// Index of a direction in the stats arrays.
pub const fn direction_index(d: Direction) -> usize {
    d as usize
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{FUNCTIONS, function_by_name};

    #[test]
    fn every_byte_part_fits_and_round_trips() {
        for (id, f) in FUNCTIONS.iter().enumerate() {
            let c = encode(id as u16, f, true);
            assert_eq!(function(c) as usize, id);
            for i in 0..2 {
                let want = f.bytes[i];
                match part(c, i as u32) {
                    None => assert_eq!(want.kind, CountKind::None, "{}", f.name),
                    Some(p) => {
                        assert!(
                            want.buf < 16 && want.count < 16 && want.datatype < 16,
                            "{}",
                            f.name
                        );
                        assert_eq!(
                            (p.buf, p.count, p.datatype),
                            (want.buf as u32, want.count as u32, want.datatype as u32)
                        );
                        assert_eq!(p.direction, want.direction as u32);
                        assert_eq!(p.kind, want.kind as u32);
                    }
                }
            }
        }
    }

    #[test]
    fn sendrecv_has_both_directions() {
        let id = function_by_name("MPI_Sendrecv").unwrap();
        let c = encode(id, &FUNCTIONS[id as usize], true);
        let (s, r) = (part(c, 0).unwrap(), part(c, 1).unwrap());
        assert_eq!((s.count, s.datatype, s.direction), (1, 2, 0));
        assert_eq!((r.count, r.datatype, r.direction), (6, 7, 1));
        assert!(!has_bytes(encode(id, &FUNCTIONS[id as usize], false)));
    }
}
