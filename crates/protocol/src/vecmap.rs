//! [`VecMap`]: an ordered map kept as a sorted `Vec`, for the SDK's small
//! maps (index definitions by tag, a client's leases by item id).
//!
//! Why not `BTreeMap`: in the wasm module every `BTreeMap<K, V>` brings its
//! own monomorphised node code (insert, split, rebalance, iterate): measured
//! with `twiggy` on the store-only module, ~11 kB for one
//! `BTreeMap<String, IndexDef>`. These maps hold at most a few hundred
//! entries, where a binary search over a `Vec` is as fast and its code is a
//! few hundred bytes. Same behaviour as `BTreeMap` for what it offers:
//! iteration in key order, `insert` returning the replaced value.

use std::borrow::Borrow;

/// A map ordered by key, stored as a sorted `Vec<(K, V)>` (see the module docs).
#[derive(Debug, Clone, PartialEq)]
pub struct VecMap<K, V>(Vec<(K, V)>);

impl<K, V> Default for VecMap<K, V> {
    fn default() -> Self {
        VecMap(Vec::new())
    }
}

impl<K: Ord, V> VecMap<K, V> {
    /// An empty map.
    pub fn new() -> Self {
        Self::default()
    }

    fn find<Q: Ord + ?Sized>(&self, key: &Q) -> Result<usize, usize>
    where
        K: Borrow<Q>,
    {
        self.0.binary_search_by(|(k, _)| k.borrow().cmp(key))
    }

    /// The value of `key`.
    pub fn get<Q: Ord + ?Sized>(&self, key: &Q) -> Option<&V>
    where
        K: Borrow<Q>,
    {
        self.find(key).ok().map(|i| &self.0[i].1)
    }

    /// The stored key and the value of `key`.
    pub fn get_key_value<Q: Ord + ?Sized>(&self, key: &Q) -> Option<(&K, &V)>
    where
        K: Borrow<Q>,
    {
        self.find(key).ok().map(|i| (&self.0[i].0, &self.0[i].1))
    }

    /// Whether `key` is in the map.
    pub fn contains_key<Q: Ord + ?Sized>(&self, key: &Q) -> bool
    where
        K: Borrow<Q>,
    {
        self.find(key).is_ok()
    }

    /// Sets `key` to `value`; returns the value it replaced.
    pub fn insert(&mut self, key: K, value: V) -> Option<V> {
        match self.find(&key) {
            Ok(i) => Some(std::mem::replace(&mut self.0[i].1, value)),
            Err(i) => {
                self.0.insert(i, (key, value));
                None
            }
        }
    }

    /// Removes `key`; returns its value.
    pub fn remove<Q: Ord + ?Sized>(&mut self, key: &Q) -> Option<V>
    where
        K: Borrow<Q>,
    {
        self.find(key).ok().map(|i| self.0.remove(i).1)
    }

    /// `(key, value)` pairs in key order.
    pub fn iter(&self) -> impl Iterator<Item = (&K, &V)> {
        self.0.iter().map(|(k, v)| (k, v))
    }

    /// Values in key order.
    pub fn values(&self) -> impl Iterator<Item = &V> {
        self.0.iter().map(|(_, v)| v)
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether the map is empty.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    /// Random operations give the same answers and the same order as
    /// `BTreeMap` (a small linear-congruential generator, fixed seeds).
    #[test]
    fn it_behaves_like_a_btreemap() {
        for seed in 1..=50u64 {
            let mut x = seed;
            let mut next = move || {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                x >> 33
            };
            let mut a: VecMap<u64, u64> = VecMap::new();
            let mut b: BTreeMap<u64, u64> = BTreeMap::new();
            for _ in 0..400 {
                let (k, v) = (next() % 40, next());
                match next() % 4 {
                    0 | 1 => assert_eq!(a.insert(k, v), b.insert(k, v)),
                    2 => assert_eq!(a.remove(&k), b.remove(&k)),
                    _ => {
                        assert_eq!(a.get(&k), b.get(&k));
                        assert_eq!(a.get_key_value(&k), b.get_key_value(&k));
                        assert_eq!(a.contains_key(&k), b.contains_key(&k));
                    }
                }
                assert_eq!(a.len(), b.len());
                assert!(
                    a.iter().eq(b.iter()),
                    "seed {seed}: same pairs in key order"
                );
            }
            assert!(a.values().eq(b.values()));
            assert_eq!(a.is_empty(), b.is_empty());
        }
    }

    #[test]
    fn string_keys_are_found_by_str() {
        let mut m: VecMap<String, u8> = VecMap::new();
        m.insert("b".into(), 2);
        m.insert("a".into(), 1);
        assert_eq!(m.get("a"), Some(&1));
        assert_eq!(
            m.iter().map(|(k, _)| k.as_str()).collect::<Vec<_>>(),
            ["a", "b"]
        );
        assert_eq!(m.remove("b"), Some(2));
        assert!(!m.contains_key("b"));
    }
}
