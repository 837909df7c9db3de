//! Which deliveries a candidate gets: those whose envelope id falls in its
//! share, by a hash every host computes the same way. So the choice sticks
//! to a message across its redeliveries and retries (its id does not
//! change), two hosts on one queue give the candidate the same messages,
//! and each step's set of messages holds the last one's (a larger share
//! only adds buckets).
//!
//! The bucket is the first 8 bytes of the SHA-256 of the id's UTF-8 bytes,
//! big-endian, modulo 10,000; a delivery is the candidate's when its bucket
//! is below the share in basis points. Documented so another tool can tell
//! which messages a candidate saw.

use sha2::{Digest, Sha256};

use super::plan::Share;

/// The bucket, 0 to 9,999, of envelope id `id`.
pub fn bucket(id: &str) -> u32 {
    let digest = Sha256::digest(id.as_bytes());
    let head = u64::from_be_bytes(digest[..8].try_into().expect("a digest has 32 bytes"));
    u32::try_from(head % 10_000).expect("below 10,000")
}

/// Whether the delivery with envelope id `id` is in `share`.
pub fn chosen(id: &str, share: Share) -> bool {
    bucket(id) < share.basis_points()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bucket_is_the_documented_hash_and_a_share_takes_about_its_part() {
        let digest = Sha256::digest(b"order-1");
        let head = u64::from_be_bytes(digest[..8].try_into().unwrap());
        assert_eq!(bucket("order-1"), (head % 10_000) as u32);
        let share = Share::parse("10%").unwrap();
        let taken = (0..20_000)
            .filter(|i| chosen(&format!("m-{i}"), share))
            .count();
        assert!((1_800..2_200).contains(&taken), "{taken} of 20,000 for 10%");
    }

    #[test]
    fn a_larger_share_keeps_every_message_of_a_smaller_one() {
        let (small, large) = (Share::parse("1%").unwrap(), Share::parse("50%").unwrap());
        for i in 0..5_000 {
            let id = format!("id-{i}");
            if chosen(&id, small) {
                assert!(chosen(&id, large), "{id}");
            }
        }
        assert!((0..100).all(|i| chosen(&format!("x{i}"), Share::ALL)));
    }
}
