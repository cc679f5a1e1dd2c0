//! Gorilla-compressed chunks of one series' samples.
//!
//! Timestamps (milliseconds) are stored as delta-of-delta, values as the XOR of their bits with the previous
//! value's, as in Facebook's Gorilla paper (Pelkonen et al., VLDB 2015) and Prometheus' XOR chunk. The value
//! bits are kept exactly, so NaN payloads (Prometheus' stale marker) and ±Inf survive a round trip.
//!
//! Layout: a big-endian `u16` sample count, then the bit stream: the first timestamp and value in 64 bits
//! each; then per sample a delta-of-delta bucket (`0`, `10`+7 bits, `110`+14, `1110`+20, `1111`+64: the
//! small 7-bit bucket absorbs the few milliseconds of scrape jitter) and an XOR value (`0` for "same";
//! `10` + the meaningful bits when they fit the previous leading/trailing zero window; `11` + 5 bits of
//! leading zeros + 6 bits of length + the bits otherwise).

/// Chunk decoding failures (a chunk from disk that is truncated or corrupt).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The bytes end before the count of samples the header announces.
    #[error("chunk truncated: {decoded} of {count} samples readable")]
    Truncated {
        /// Samples decoded before the end.
        decoded: usize,
        /// Samples the header announced.
        count: usize,
    },
    /// Too short to hold a header.
    #[error("chunk too short ({0} bytes)")]
    TooShort(usize),
}

/// Chunk result.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Most samples one chunk holds (the count is a `u16`).
pub const MAX_SAMPLES: usize = u16::MAX as usize;

#[derive(Debug, Clone, Default)]
struct BitWriter {
    bytes: Vec<u8>,
    /// Free bits in the last byte (0 = the next bit starts a new byte).
    free: u8,
}

impl BitWriter {
    fn write_bit(&mut self, bit: bool) {
        if self.free == 0 {
            self.bytes.push(0);
            self.free = 8;
        }
        if bit && let Some(last) = self.bytes.last_mut() {
            *last |= 1 << (self.free - 1);
        }
        self.free -= 1;
    }

    /// Writes the low `n` bits of `v` (`n` ≤ 64), most significant first: the free bits of the last byte,
    /// then whole bytes at once (bit by bit, this was a tenth of the ingest time).
    fn write_bits(&mut self, v: u64, n: u8) {
        debug_assert!(n <= 64);
        if n == 0 {
            return;
        }
        let mut n = n.min(64);
        let v = if n == 64 { v } else { v & ((1u64 << n) - 1) };
        if self.free > 0 {
            let take = n.min(self.free);
            let chunk = (v >> (n - take)) as u8 & (((1u16 << take) - 1) as u8);
            if let Some(last) = self.bytes.last_mut() {
                *last |= chunk << (self.free - take);
            }
            self.free -= take;
            n -= take;
            if n == 0 {
                return;
            }
        }
        // byte-aligned now: the remaining `n` bits, left-aligned, in as many bytes as they need
        let rest = (v << (64 - n)).to_be_bytes();
        let whole = (n as usize).div_ceil(8);
        self.bytes.extend_from_slice(&rest[..whole]);
        self.free = (whole * 8 - n as usize) as u8;
    }
}

#[derive(Debug, Clone)]
struct BitReader<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl BitReader<'_> {
    #[inline(always)]
    fn read_bit(&mut self) -> Option<bool> {
        let byte = *self.bytes.get(self.pos / 8)?;
        let bit = byte & (0x80 >> (self.pos % 8)) != 0;
        self.pos += 1;
        Some(bit)
    }

    /// Reads `n` ≤ 64 bits at once (one 64-bit load when the bits fit in it, else a 128-bit window).
    #[inline(always)]
    fn read_bits(&mut self, n: u8) -> Option<u64> {
        if n == 0 {
            return Some(0);
        }
        if self.pos + n as usize > self.bytes.len() * 8 {
            return None;
        }
        let byte = self.pos / 8;
        let shift = (self.pos % 8) as u32;
        let v = if let Some(w) = self.bytes.get(byte..byte + 8)
            && n as u32 + shift <= 64
        {
            let mut word = [0u8; 8];
            word.copy_from_slice(w);
            (u64::from_be_bytes(word) << shift) >> (64 - n as u32)
        } else {
            let mut buf = [0u8; 16];
            let avail = (self.bytes.len() - byte).min(16);
            buf[..avail].copy_from_slice(&self.bytes[byte..byte + avail]);
            let window = u128::from_be_bytes(buf) << shift;
            (window >> (128 - n as u32)) as u64
        };
        self.pos += n as usize;
        Some(v)
    }
}

/// Delta-of-delta buckets: (prefix bits, prefix length, value bits).
const DOD_BUCKETS: [(u64, u8, u8); 3] = [(0b10, 2, 7), (0b110, 3, 14), (0b1110, 4, 20)];

fn fits(dod: i64, bits: u8) -> bool {
    let half = 1i64 << (bits - 1);
    dod > -half && dod <= half
}

fn from_bits(v: u64, bits: u8) -> i64 {
    let v = v as i64;
    if v > (1i64 << (bits - 1)) {
        v - (1i64 << bits)
    } else {
        v
    }
}

/// An append-only compressed chunk.
#[derive(Debug, Clone)]
pub struct Chunk {
    w: BitWriter,
    count: u16,
    first_t: i64,
    t: i64,
    delta: i64,
    v: u64,
    leading: u8,
    trailing: u8,
}

impl Default for Chunk {
    fn default() -> Self {
        Self::new()
    }
}

/// The bytes of an empty chunk (its sample count), with room for the first sample (16 bytes) and a few
/// more: grown from 2 bytes, the first sample alone took four reallocations (~2 % of ingest).
fn new_chunk_bytes() -> Vec<u8> {
    let mut bytes = Vec::with_capacity(32);
    bytes.extend_from_slice(&[0, 0]);
    bytes
}

impl Chunk {
    /// An empty chunk.
    pub fn new() -> Self {
        Chunk {
            w: BitWriter {
                bytes: new_chunk_bytes(),
                free: 0,
            },
            count: 0,
            first_t: 0,
            t: 0,
            delta: 0,
            v: 0,
            leading: 0xff,
            trailing: 0,
        }
    }

    /// Rebuilds an appendable chunk from its bytes (re-encoding gives the same bytes).
    pub fn from_bytes(bytes: &[u8]) -> Result<Self> {
        let mut c = Chunk::new();
        for s in iter(bytes)? {
            let (t, v) = s?;
            c.push(t, v);
        }
        Ok(c)
    }

    /// Samples in the chunk.
    pub fn len(&self) -> usize {
        self.count as usize
    }

    /// Whether the chunk holds no sample.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// First timestamp (0 when empty).
    pub fn first_t(&self) -> i64 {
        self.first_t
    }

    /// Last timestamp (0 when empty).
    pub fn last_t(&self) -> i64 {
        self.t
    }

    /// The encoded bytes.
    pub fn bytes(&self) -> &[u8] {
        &self.w.bytes
    }

    /// Bytes its buffer holds allocated.
    pub fn bytes_allocated(&self) -> usize {
        self.w.bytes.capacity()
    }

    /// The encoded chunk, as [`Chunk::bytes`].
    pub fn into_bytes(self) -> Vec<u8> {
        self.w.bytes
    }

    /// Appends a sample. The caller keeps timestamps strictly increasing and the chunk under
    /// [`MAX_SAMPLES`]; returns false (and appends nothing) otherwise.
    pub fn append(&mut self, t: i64, v: f64) -> bool {
        if (self.count > 0 && t <= self.t) || self.len() >= MAX_SAMPLES {
            return false;
        }
        self.push(t, v);
        true
    }

    fn push(&mut self, t: i64, v: f64) {
        let bits = v.to_bits();
        match self.count {
            0 => {
                self.w.write_bits(t as u64, 64);
                self.w.write_bits(bits, 64);
                self.first_t = t;
            }
            1 => {
                let delta = t.wrapping_sub(self.t);
                self.write_dod(delta);
                self.delta = delta;
                self.write_xor(bits);
            }
            _ => {
                let delta = t.wrapping_sub(self.t);
                self.write_dod(delta.wrapping_sub(self.delta));
                self.delta = delta;
                self.write_xor(bits);
            }
        }
        self.t = t;
        self.v = bits;
        self.count += 1;
        let [hi, lo] = self.count.to_be_bytes();
        self.w.bytes[0] = hi;
        self.w.bytes[1] = lo;
    }

    fn write_dod(&mut self, dod: i64) {
        if dod == 0 {
            self.w.write_bit(false);
            return;
        }
        for (prefix, plen, bits) in DOD_BUCKETS {
            if fits(dod, bits) {
                // the prefix and the value in one write (at most 24 bits)
                let value = dod as u64 & ((1u64 << bits) - 1);
                self.w.write_bits((prefix << bits) | value, plen + bits);
                return;
            }
        }
        self.w.write_bits(0b1111, 4);
        self.w.write_bits(dod as u64, 64);
    }

    fn write_xor(&mut self, bits: u64) {
        let delta = bits ^ self.v;
        if delta == 0 {
            self.w.write_bit(false);
            return;
        }
        let leading = (delta.leading_zeros() as u8).min(31);
        let trailing = delta.trailing_zeros() as u8;
        // control bits and value written together when they fit in 64 bits (writes one by one were most
        // of the chunk's encoding time)
        let (head, head_bits, value, sig) =
            if self.leading != 0xff && leading >= self.leading && trailing >= self.trailing {
                // `10`, the value in the previous window
                let sig = 64 - self.leading - self.trailing;
                (0b10, 2, delta >> self.trailing, sig)
            } else {
                self.leading = leading;
                self.trailing = trailing;
                let sig = 64 - leading - trailing;
                // `11`, leading zeros (5 bits), significant bits (6 bits: 64 is written as 0, since 0
                // is never needed), the value
                let head = (0b11 << 11) | ((leading as u64) << 6) | (sig & 63) as u64;
                (head, 13, delta >> trailing, sig)
            };
        if head_bits + sig <= 64 {
            // `value` has at most `sig` bits
            self.w.write_bits((head << sig) | value, head_bits + sig);
        } else {
            self.w.write_bits(head, head_bits);
            self.w.write_bits(value, sig);
        }
    }
}

/// Iterates over an encoded chunk's samples. Fails at once if the header is missing; a truncated body
/// ends the iteration with an error.
pub fn iter(bytes: &[u8]) -> Result<Iter<'_>> {
    if bytes.len() < 2 {
        return Err(Error::TooShort(bytes.len()));
    }
    let count = u16::from_be_bytes([bytes[0], bytes[1]]) as usize;
    Ok(Iter {
        r: BitReader {
            bytes: &bytes[2..],
            pos: 0,
        },
        count,
        i: 0,
        t: 0,
        delta: 0,
        v: 0,
        leading: 0,
        trailing: 0,
        failed: false,
    })
}

/// Decodes every sample of a chunk.
pub fn decode(bytes: &[u8]) -> Result<Vec<(i64, f64)>> {
    let mut out = Vec::new();
    decode_into(bytes, &mut out)?;
    Ok(out)
}

/// Appends every sample of a chunk to `out` (on error, the samples decoded before it are kept).
pub fn decode_into(bytes: &[u8], out: &mut Vec<(i64, f64)>) -> Result<()> {
    let mut it = iter(bytes)?;
    out.reserve(it.count);
    while it.i < it.count {
        let Some((t, v)) = it.step() else {
            return Err(Error::Truncated {
                decoded: it.i,
                count: it.count,
            });
        };
        it.i += 1;
        out.push((t, f64::from_bits(v)));
    }
    Ok(())
}

/// Sample iterator over an encoded chunk.
#[derive(Debug, Clone)]
pub struct Iter<'a> {
    r: BitReader<'a>,
    count: usize,
    i: usize,
    t: i64,
    delta: i64,
    v: u64,
    leading: u8,
    trailing: u8,
    failed: bool,
}

impl Iter<'_> {
    #[inline(always)]
    fn read_dod(&mut self) -> Option<i64> {
        let mut ones = 0u8;
        while ones < 4 {
            if !self.r.read_bit()? {
                break;
            }
            ones += 1;
        }
        Some(match ones {
            0 => 0,
            4 => self.r.read_bits(64)? as i64,
            n => {
                let bits = DOD_BUCKETS[n as usize - 1].2;
                from_bits(self.r.read_bits(bits)?, bits)
            }
        })
    }

    #[inline(always)]
    fn read_xor(&mut self) -> Option<u64> {
        if !self.r.read_bit()? {
            return Some(self.v);
        }
        if self.r.read_bit()? {
            self.leading = self.r.read_bits(5)? as u8;
            let mut sig = self.r.read_bits(6)? as u8;
            if sig == 0 {
                sig = 64;
            }
            self.trailing = 64u8.saturating_sub(self.leading).saturating_sub(sig);
        }
        let sig = 64u8
            .saturating_sub(self.leading)
            .saturating_sub(self.trailing);
        let bits = self.r.read_bits(sig)?;
        let delta = bits.checked_shl(self.trailing as u32).unwrap_or(0);
        Some(self.v ^ delta)
    }

    #[inline(always)]
    fn step(&mut self) -> Option<(i64, u64)> {
        match self.i {
            0 => {
                self.t = self.r.read_bits(64)? as i64;
                self.v = self.r.read_bits(64)?;
            }
            1 => {
                self.delta = self.read_dod()?;
                self.t = self.t.wrapping_add(self.delta);
                self.v = self.read_xor()?;
            }
            _ => {
                let dod = self.read_dod()?;
                self.delta = self.delta.wrapping_add(dod);
                self.t = self.t.wrapping_add(self.delta);
                self.v = self.read_xor()?;
            }
        }
        Some((self.t, self.v))
    }
}

impl Iterator for Iter<'_> {
    type Item = Result<(i64, f64)>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed || self.i >= self.count {
            return None;
        }
        match self.step() {
            Some((t, v)) => {
                self.i += 1;
                Some(Ok((t, f64::from_bits(v))))
            }
            None => {
                self.failed = true;
                Some(Err(Error::Truncated {
                    decoded: self.i,
                    count: self.count,
                }))
            }
        }
    }
}

/// Prometheus' staleness marker: a NaN with this exact bit pattern.
pub const STALE_NAN_BITS: u64 = 0x7ff0_0000_0000_0002;

/// Whether a value is the staleness marker.
pub fn is_stale(v: f64) -> bool {
    v.to_bits() == STALE_NAN_BITS
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip(samples: &[(i64, f64)]) -> Chunk {
        let mut c = Chunk::new();
        for &(t, v) in samples {
            assert!(c.append(t, v));
        }
        let back = decode(c.bytes()).expect("decodes");
        assert_eq!(back.len(), samples.len());
        for ((t1, v1), (t2, v2)) in samples.iter().zip(&back) {
            assert_eq!(t1, t2);
            assert_eq!(v1.to_bits(), v2.to_bits(), "value bits at {t1}");
        }
        c
    }

    #[test]
    fn regular_samples_round_trip() {
        let s: Vec<_> = (0..120)
            .map(|i| (1_700_000_000_000 + i * 30_000, i as f64 * 1.5))
            .collect();
        round_trip(&s);
    }

    #[test]
    fn special_values_round_trip() {
        let stale = f64::from_bits(STALE_NAN_BITS);
        let s = [
            (1, 0.0),
            (2, f64::NAN),
            (3, f64::INFINITY),
            (4, f64::NEG_INFINITY),
            (5, stale),
            (6, -0.0),
            (7, f64::MAX),
            (8, f64::MIN_POSITIVE),
            (9, 1e-300),
            (10, stale),
            (11, 42.0),
        ];
        let c = round_trip(&s);
        let back = decode(c.bytes()).expect("decodes");
        assert!(is_stale(back[4].1));
        assert!(!is_stale(back[1].1));
    }

    #[test]
    fn irregular_timestamps_use_every_bucket() {
        let mut t = -5_000i64;
        let mut s = Vec::new();
        for (i, step) in [
            1i64,
            30_000,
            30_003,
            29_990,
            40_000,
            600_000,
            1 << 40,
            7,
            7,
            30_000,
        ]
        .iter()
        .enumerate()
        {
            t += step;
            s.push((t, i as f64));
        }
        round_trip(&s);
    }

    #[test]
    fn single_and_empty_chunks() {
        assert!(decode(Chunk::new().bytes()).expect("empty").is_empty());
        round_trip(&[(i64::MIN + 1, f64::NAN)]);
        round_trip(&[(i64::MAX - 10, 1.0), (i64::MAX, 2.0)]);
    }

    #[test]
    fn out_of_order_append_is_refused() {
        let mut c = Chunk::new();
        assert!(c.append(10, 1.0));
        assert!(!c.append(10, 2.0));
        assert!(!c.append(9, 2.0));
        assert_eq!(c.len(), 1);
    }

    #[test]
    fn from_bytes_gives_the_same_encoding_and_keeps_appending() {
        let mut c = Chunk::new();
        for i in 0..50 {
            c.append(i * 1000 + (i % 3), (i * i) as f64);
        }
        let mut d = Chunk::from_bytes(c.bytes()).expect("rebuilds");
        assert_eq!(c.bytes(), d.bytes());
        c.append(100_000, 0.25);
        d.append(100_000, 0.25);
        assert_eq!(c.bytes(), d.bytes());
    }

    #[test]
    fn corrupt_chunks_give_errors_not_panics() {
        assert!(iter(&[1]).is_err());
        let mut c = Chunk::new();
        for i in 0..20 {
            c.append(i * 15_000, i as f64 * 0.1);
        }
        let bytes = c.bytes();
        for cut in 2..bytes.len() {
            let r: Result<Vec<_>> = iter(&bytes[..cut]).expect("header").collect();
            assert!(r.is_err(), "cut at {cut} should fail");
        }
        // Random garbage never panics.
        let mut x = 0x1234_5678_9abc_def0u64;
        for _ in 0..200 {
            let mut junk = Vec::new();
            for _ in 0..40 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                junk.push(x as u8);
            }
            let _ = iter(&junk).map(|it| it.count());
        }
    }

    #[test]
    fn constant_series_cost_about_two_bits_per_sample() {
        let mut c = Chunk::new();
        for i in 0..120 {
            c.append(i * 30_000, 1.0);
        }
        // 2 count bytes + 16 first-sample bytes + the delta + 118 × 2 bits.
        assert!(c.bytes().len() <= 2 + 16 + 4 + 30, "{}", c.bytes().len());
    }

    /// The chunk's encoding written field by field, bit by bit (as chunks on disk were first written):
    /// the encoder's merged writes give the same bytes for every bucket of delta-of-delta and every kind
    /// of XOR value.
    #[test]
    fn samples_encode_as_they_did_field_by_field() {
        fn bits(out: &mut (Vec<u8>, u8), v: u64, n: u8) {
            for i in (0..n).rev() {
                if out.1 == 0 {
                    out.0.push(0);
                    out.1 = 8;
                }
                if (v >> i) & 1 == 1 {
                    *out.0.last_mut().expect("pushed") |= 1 << (out.1 - 1);
                }
                out.1 -= 1;
            }
        }
        fn reference(samples: &[(i64, f64)]) -> Vec<u8> {
            let mut out = (Vec::new(), 0u8);
            let (mut t, mut delta, mut v, mut lead, mut trail) = (0i64, 0i64, 0u64, 0xffu8, 0u8);
            for (i, &(st, sv)) in samples.iter().enumerate() {
                let b = sv.to_bits();
                if i == 0 {
                    bits(&mut out, st as u64, 64);
                    bits(&mut out, b, 64);
                } else {
                    let d = st - t;
                    let dod = if i == 1 { d } else { d - delta };
                    delta = d;
                    match DOD_BUCKETS.iter().find(|(_, _, n)| fits(dod, *n)) {
                        _ if dod == 0 => bits(&mut out, 0, 1),
                        Some(&(prefix, plen, n)) => {
                            bits(&mut out, prefix, plen);
                            bits(&mut out, dod as u64, n);
                        }
                        None => {
                            bits(&mut out, 0b1111, 4);
                            bits(&mut out, dod as u64, 64);
                        }
                    }
                    let x = b ^ v;
                    if x == 0 {
                        bits(&mut out, 0, 1);
                    } else {
                        bits(&mut out, 1, 1);
                        let (l, tz) = ((x.leading_zeros() as u8).min(31), x.trailing_zeros() as u8);
                        if lead != 0xff && l >= lead && tz >= trail {
                            bits(&mut out, 0, 1);
                            bits(&mut out, x >> trail, 64 - lead - trail);
                        } else {
                            (lead, trail) = (l, tz);
                            bits(&mut out, 1, 1);
                            bits(&mut out, l as u64, 5);
                            bits(&mut out, ((64 - l - tz) & 63) as u64, 6);
                            bits(&mut out, x >> tz, 64 - l - tz);
                        }
                    }
                }
                (t, v) = (st, b);
            }
            let mut bytes = (samples.len() as u16).to_be_bytes().to_vec();
            bytes.extend(out.0);
            bytes
        }
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for _ in 0..300 {
            let mut samples = Vec::new();
            let mut t = next() as i64 >> 20;
            for i in 0..(next() % 120 + 1) {
                // steps of every bucket (0, 7, 14, 20 and 64 bits of delta-of-delta) and values that
                // repeat, change in a few bits, or in all of them
                t += match next() % 6 {
                    0 => 15_000,
                    1 => 15_000 + (next() % 100) as i64,
                    2 => (next() % 10_000) as i64 + 1,
                    3 => (next() % 1_000_000) as i64 + 1,
                    4 => (next() % (1 << 40)) as i64 + 1,
                    _ => 1,
                };
                let v = match next() % 5 {
                    0 => 1.0,
                    1 => i as f64,
                    2 => f64::from_bits(next()),
                    3 => (next() % 1000) as f64 * 0.25,
                    _ => f64::NAN,
                };
                samples.push((t, v));
            }
            let mut c = Chunk::new();
            for &(t, v) in &samples {
                assert!(c.append(t, v));
            }
            assert_eq!(c.bytes(), reference(&samples), "{samples:?}");
        }
    }

    /// The bit-by-bit writer the chunks on disk were written with: whole-byte writes must give the same
    /// bytes, or a chunk written before would read back wrong.
    #[test]
    fn bits_written_a_byte_at_a_time_are_the_bits_written_one_by_one() {
        fn reference(bytes: &mut Vec<u8>, free: &mut u8, v: u64, mut n: u8) {
            while n > 0 {
                if *free == 0 {
                    bytes.push(0);
                    *free = 8;
                }
                let take = n.min(*free);
                let chunk = ((v >> (n - take)) & ((1u64 << take) - 1)) as u8;
                *bytes.last_mut().expect("pushed") |= chunk << (*free - take);
                *free -= take;
                n -= take;
            }
        }
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for start_free in [0u8, 3, 8] {
            let mut w = BitWriter {
                bytes: vec![0xa5],
                free: start_free,
            };
            let (mut bytes, mut free) = (vec![0xa5], start_free);
            for _ in 0..5_000 {
                let v = next();
                let n = (next() % 65) as u8;
                w.write_bits(v, n);
                reference(&mut bytes, &mut free, v, n);
                if n.is_multiple_of(7) {
                    let bit = v & 1 == 1;
                    w.write_bit(bit);
                    reference(&mut bytes, &mut free, bit as u64, 1);
                }
                assert_eq!((&w.bytes, w.free), (&bytes, free), "v={v:#x} n={n}");
            }
        }
    }
}
