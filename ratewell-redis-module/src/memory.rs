//! A keyspace in memory, for the tests and the fuzz target: strings and lists with expiries on
//! a clock the caller sets.

use std::collections::HashMap;

use crate::batch::{Store, WrongType};

/// A value of [`Memory`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Value {
    /// A string.
    String(Vec<u8>),
    /// A list, head first.
    List(Vec<Vec<u8>>),
}

/// A keyspace in memory: a [`Store`] over the keys of one command at a time.
///
/// # Examples
///
/// ```
/// use ratewell_redis_module::{Memory, Policies, Reply, decide};
///
/// let mut store = Memory::new(1_000_000);
/// let mut policies = Policies::default();
/// // One request, one layer: now (the server's), cost 1, take, each key's own TTL.
/// let args: [&[u8]; 9] = [b"1", b"1", b"6", b"", b"1", b"take", b"",
///     b"fixed 2 1000000 0 0 0 0|fixed-window limit=2 window=1s", b"0"];
/// let reply = store.run(&mut policies, &[b"k"], &args).unwrap();
/// assert_eq!(reply[1], Reply::Int(1)); // admitted
/// assert_eq!(reply[3], Reply::Int(1)); // remaining
/// assert!(store.get(b"k").is_some());
/// ```
#[derive(Debug, Default)]
pub struct Memory {
    /// Microseconds since the Unix epoch.
    pub now_us: u64,
    values: HashMap<Vec<u8>, (Value, Option<u64>)>,
    keys: Vec<Vec<u8>>,
}

impl Memory {
    /// An empty keyspace at `now_us`.
    pub fn new(now_us: u64) -> Self {
        Memory { now_us, ..Memory::default() }
    }

    /// A key's value, if it exists and has not expired.
    pub fn get(&self, key: &[u8]) -> Option<&Value> {
        self.values
            .get(key)
            .filter(|(_, at)| at.is_none_or(|at| at * 1_000 > self.now_us))
            .map(|(v, _)| v)
    }

    /// A key's absolute expiry (ms since the epoch), if it has one.
    pub fn expiry_ms(&self, key: &[u8]) -> Option<u64> {
        self.get(key)?;
        self.values.get(key)?.1
    }

    /// Every live key.
    pub fn keys(&self) -> Vec<Vec<u8>> {
        let mut keys: Vec<_> =
            self.values.keys().filter(|k| self.get(k).is_some()).cloned().collect();
        keys.sort();
        keys
    }

    /// Store a value (no expiry).
    pub fn insert(&mut self, key: &[u8], value: Value) {
        self.values.insert(key.to_vec(), (value, None));
    }

    /// Run a command on `keys` with the library's `args`, as the module does.
    pub fn run(
        &mut self,
        policies: &mut crate::Policies,
        keys: &[&[u8]],
        args: &[&[u8]],
    ) -> Result<Vec<crate::Reply>, String> {
        self.values.retain(|_, (_, at)| at.is_none_or(|at| at * 1_000 > self.now_us));
        self.keys = keys.iter().map(|k| k.to_vec()).collect();
        crate::decide(self, policies, keys, args)
    }

    fn entry(&mut self, key: usize) -> Option<&mut (Value, Option<u64>)> {
        self.values.get_mut(&self.keys[key])
    }

    fn list_mut(&mut self, key: usize) -> Option<&mut Vec<Vec<u8>>> {
        match self.entry(key) {
            Some((Value::List(l), _)) => Some(l),
            _ => None,
        }
    }
}

impl Store for Memory {
    fn now_us(&mut self) -> u64 {
        self.now_us
    }

    fn get(&mut self, key: usize) -> Result<Option<Vec<u8>>, WrongType> {
        match self.entry(key) {
            None => Ok(None),
            Some((Value::String(s), _)) => Ok(Some(s.clone())),
            Some(_) => Err(WrongType),
        }
    }

    fn set(&mut self, key: usize, value: &[u8], ttl_ms: u64) {
        let at = self.now_us / 1_000 + ttl_ms;
        self.values.insert(self.keys[key].clone(), (Value::String(value.to_vec()), Some(at)));
    }

    fn delete(&mut self, key: usize) {
        let k = self.keys[key].clone();
        self.values.remove(&k);
    }

    fn list(&mut self, key: usize) -> Result<Vec<Vec<u8>>, WrongType> {
        match self.entry(key) {
            None => Ok(Vec::new()),
            Some((Value::List(l), _)) => Ok(l.clone()),
            Some(_) => Err(WrongType),
        }
    }

    fn list_trim_front(&mut self, key: usize, n: usize) {
        if let Some(l) = self.list_mut(key) {
            l.drain(..n.min(l.len()));
        }
    }

    fn list_set(&mut self, key: usize, index: usize, value: &[u8]) {
        if let Some(e) = self.list_mut(key).and_then(|l| l.get_mut(index)) {
            *e = value.to_vec();
        }
    }

    fn list_push(&mut self, key: usize, value: &[u8]) {
        let k = self.keys[key].clone();
        match self.values.get_mut(&k) {
            Some((Value::List(l), _)) => l.push(value.to_vec()),
            _ => {
                self.values.insert(k, (Value::List(vec![value.to_vec()]), None));
            }
        }
    }

    fn list_remove(&mut self, key: usize, index: usize) {
        let k = self.keys[key].clone();
        if let Some(l) = self.list_mut(key) {
            if index < l.len() {
                l.remove(index);
            }
            if l.is_empty() {
                self.values.remove(&k);
            }
        }
    }

    fn expire(&mut self, key: usize, ttl_ms: u64) {
        let at = self.now_us / 1_000 + ttl_ms;
        if let Some(e) = self.entry(key) {
            e.1 = Some(at);
        }
    }
}
