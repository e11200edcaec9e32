//! Kafka's default partitioner for keyed records, byte-exact with the Java client.
//!
//! Records written by eddy must land on the same partition as records with the same key
//! written by any other Kafka client (and by Kafka Streams), otherwise co-partitioned joins
//! and per-key ordering break. The Java client picks `toPositive(murmur2(key)) % partitions`,
//! so this module reproduces `org.apache.kafka.common.utils.Utils.murmur2` bit for bit:
//! 32-bit wrapping arithmetic, little-endian 4-byte blocks, logical (`>>>`) shifts.

/// Seed used by Kafka's `Utils.murmur2`.
const SEED: u32 = 0x9747_b28c;
/// Mixing constant of MurmurHash2.
const M: u32 = 0x5bd1_e995;
/// Shift of MurmurHash2's block mix.
const R: u32 = 24;

/// Kafka's `Utils.murmur2`: MurmurHash2 (32-bit) with seed `0x9747b28c`.
///
/// Returns the hash as Java's signed `int`, so values compare directly with Kafka's tests.
pub fn murmur2(data: &[u8]) -> i32 {
    // Java truncates the length to int; keys over 2 GiB cannot exist in Kafka anyway.
    let mut h = SEED ^ (data.len() as u32);

    let mut blocks = data.chunks_exact(4);
    for block in &mut blocks {
        let mut k = u32::from_le_bytes([block[0], block[1], block[2], block[3]]);
        k = k.wrapping_mul(M);
        k ^= k >> R;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M);
        h ^= k;
    }

    // The Java `switch` falls through from case 3 to case 1.
    let tail = blocks.remainder();
    if tail.len() >= 3 {
        h ^= u32::from(tail[2]) << 16;
    }
    if tail.len() >= 2 {
        h ^= u32::from(tail[1]) << 8;
    }
    if let Some(&first) = tail.first() {
        h ^= u32::from(first);
        h = h.wrapping_mul(M);
    }

    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^= h >> 15;
    h as i32
}

/// Kafka's `Utils.toPositive`: clears the sign bit (not `abs`, which overflows on `i32::MIN`).
pub fn to_positive(n: i32) -> i32 {
    n & 0x7fff_ffff
}

/// The partition the Java producer's default partitioner picks for a non-null key.
///
/// `num_partitions` is the topic's partition count and must be positive (a topic always has at
/// least one partition); this panics otherwise, as an integer division by zero would.
pub fn partition_for(key: &[u8], num_partitions: i32) -> i32 {
    assert!(
        num_partitions > 0,
        "partition count must be positive, got {num_partitions}"
    );
    to_positive(murmur2(key)) % num_partitions
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The cases of Apache Kafka's `UtilsTest.testMurmur2`
    /// (clients/src/test/java/org/apache/kafka/common/utils/UtilsTest.java).
    #[test]
    fn murmur2_matches_kafka_utils_test() {
        let cases: [(&[u8], i32); 6] = [
            (b"21", -973_932_308),
            (b"foobar", -790_332_482),
            (b"a-little-bit-long-string", -985_981_536),
            (b"a-little-bit-longer-string", -1_486_304_829),
            (
                b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8",
                -58_897_971,
            ),
            (b"abc", 479_470_107), // `new byte[] {'a', 'b', 'c'}` in the Java test
        ];
        for (data, expected) in cases {
            assert_eq!(
                murmur2(data),
                expected,
                "murmur2({:?})",
                String::from_utf8_lossy(data)
            );
        }
    }

    #[test]
    fn to_positive_clears_only_the_sign_bit() {
        assert_eq!(to_positive(0), 0);
        assert_eq!(to_positive(5), 5);
        assert_eq!(to_positive(-1), i32::MAX);
        assert_eq!(to_positive(i32::MIN), 0);
        assert_eq!(to_positive(-973_932_308), 1_173_551_340);
    }

    #[test]
    fn partition_for_matches_the_java_formula() {
        // (-790332482 & 0x7fffffff) = 1357151166; % 50 = 16, % 12 = 6, % 3 = 0.
        assert_eq!(partition_for(b"foobar", 50), 16);
        assert_eq!(partition_for(b"foobar", 12), 6);
        assert_eq!(partition_for(b"foobar", 3), 0);
        // (-973932308 & 0x7fffffff) = 1173551340; % 7 = 3.
        assert_eq!(partition_for(b"21", 7), 3);
        // 479470107 % 10 = 7.
        assert_eq!(partition_for(b"abc", 10), 7);
        for n in 1..=64 {
            let p = partition_for(b"a-little-bit-long-string", n);
            assert!((0..n).contains(&p));
        }
        assert_eq!(partition_for(b"anything", 1), 0);
    }

    #[test]
    fn empty_key_hashes_like_java() {
        // No blocks and no tail: only the final mix of `seed ^ 0` (value shared by other ports).
        assert_eq!(murmur2(b""), 275_646_681);
    }

    #[test]
    #[should_panic(expected = "partition count must be positive")]
    fn zero_partitions_is_a_bug() {
        partition_for(b"k", 0);
    }
}
