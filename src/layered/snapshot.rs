//! Snapshot and restore of a [`LayeredLimiter`]: every layer's keys written to bytes, and read
//! back into the layers of the same names.

use super::LayeredLimiter;
use crate::clock::Clock;
#[cfg(doc)]
use crate::keyed::KeyedLimiter;
use crate::snapshot::{self, Restored, Resume, SnapshotError, SnapshotInfo};

impl<C: Clock> LayeredLimiter<C> {
    /// Write a snapshot of every layer's keys to `w` while decisions go on (each key's state as
    /// it was at some instant of the snapshot; see [`KeyedLimiter::snapshot`]). Read back with
    /// [`restore`](Self::restore).
    ///
    /// # Examples
    ///
    /// ```
    /// use ratewell::{Layer, LayeredLimiter, ManualClock, Policy};
    ///
    /// let layers = || vec![
    ///     Layer::new("ip", &"token-bucket capacity=5 rate=1/s".parse::<Policy>().unwrap()),
    ///     Layer::new("daily", &"fixed-window limit=100 window=1d".parse::<Policy>().unwrap()),
    /// ];
    /// let limiter = LayeredLimiter::with_clock(layers(), ManualClock::new(0))?;
    /// limiter.check(&[&"192.0.2.7", &"alice"], 3)?;
    /// let mut bytes = Vec::new();
    /// limiter.snapshot(&mut bytes)?;
    ///
    /// let mut restarted = LayeredLimiter::with_clock(layers(), ManualClock::new(0))?;
    /// restarted.restore(&bytes[..])?;
    /// let d = restarted.peek(&[&"192.0.2.7", &"alice"], 1)?;
    /// assert_eq!(d.layer(1).unwrap().remaining(), 97);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn snapshot(&self, mut w: impl std::io::Write) -> std::io::Result<SnapshotInfo> {
        let (bytes, info) = self.snapshot_bytes();
        w.write_all(&bytes)?;
        w.flush()?;
        Ok(info)
    }

    /// [`snapshot`](Self::snapshot) into the file at `path`, replacing it only once the new one
    /// is whole (see [`KeyedLimiter::save`]).
    pub fn save(&self, path: impl AsRef<std::path::Path>) -> std::io::Result<SnapshotInfo> {
        let (bytes, info) = self.snapshot_bytes();
        snapshot::write_file(path.as_ref(), &bytes)?;
        Ok(info)
    }

    fn snapshot_bytes(&self) -> (Vec<u8>, SnapshotInfo) {
        let anchor = std::time::SystemTime::now();
        let wall = snapshot::wall_ns(anchor);
        let now = self.floor.now(&self.clock);
        let mut out = snapshot::Out(Vec::new());
        out.header(snapshot::KIND_LAYERED, self.layers.len() as u8, now, wall);
        let mut keys = 0;
        for layer in self.layers.iter() {
            let (bytes, n) = layer.table.snapshot_bytes(now, wall);
            out.text(&layer.name);
            out.u64(bytes.len() as u64);
            out.bytes(&bytes);
            keys += n;
        }
        out.seal();
        let info = SnapshotInfo { keys, bytes: out.0.len() as u64, anchor };
        (out.0, info)
    }

    /// Replace every layer's keys by a snapshot's, counting the system time that passed since
    /// it was taken. See [`restore_with`](Self::restore_with).
    pub fn restore(&mut self, r: impl std::io::Read) -> Result<Restored, SnapshotError> {
        self.restore_with(r, Resume::WallClock)
    }

    /// [`restore`](Self::restore) from the file at `path`.
    pub fn load(&mut self, path: impl AsRef<std::path::Path>) -> Result<Restored, SnapshotError> {
        self.restore(std::fs::File::open(path)?)
    }

    /// Replace every layer's keys by the snapshot read from `r`, with time passed as `resume`
    /// says, as [`KeyedLimiter::restore`] does for one table. Layers are matched by name:
    /// a layer the snapshot does not name starts empty, and a layer of the snapshot this
    /// limiter does not have is ignored (named in [`Restored::ignored_layers`]). Each layer
    /// needs the capacity it was snapshotted with. The whole snapshot is checked before
    /// anything changes: on an error the limiter is as it was.
    pub fn restore_with(
        &mut self,
        r: impl std::io::Read,
        resume: Resume,
    ) -> Result<Restored, SnapshotError> {
        let limit = self
            .layers
            .iter()
            .map(|l| l.table.snapshot_limit())
            .fold(1024u64, |a, b| a.saturating_add(b).saturating_add(65_536));
        let bytes = snapshot::read_all(r, limit)?;
        let (header, mut input) = snapshot::open(&bytes)?;
        if header.kind != snapshot::KIND_LAYERED {
            return Err(SnapshotError::Kind {
                found: snapshot::kind_name(header.kind),
                expected: snapshot::kind_name(snapshot::KIND_LAYERED),
            });
        }
        let mut parsed: Vec<Option<_>> = self.layers.iter().map(|_| None).collect();
        let mut ignored = Vec::new();
        for _ in 0..header.count {
            let name = input.text()?;
            let len = input.u64()?;
            let body = input.take(usize::try_from(len).map_err(|_| SnapshotError::Truncated)?)?;
            match self.layers.iter().position(|l| l.name == name) {
                Some(i) if parsed[i].is_none() => {
                    parsed[i] = Some(self.layers[i].table.parse_snapshot(body)?);
                }
                Some(_) => return Err(SnapshotError::Corrupt("a layer named twice")),
                None => ignored.push(name.to_owned()),
            }
        }
        if !input.is_empty() {
            return Err(SnapshotError::Corrupt("bytes after the last layer"));
        }
        let elapsed = snapshot::elapsed(resume, header.anchor);
        let reading = self.floor.reading(&self.clock);
        let offset = snapshot::offset(header.now, elapsed, reading);
        self.floor.set_offset(offset);
        let now = reading.wrapping_add(offset);
        let mut restored = Restored::default();
        for (layer, parsed) in self.layers.iter_mut().zip(parsed) {
            match parsed {
                Some(parsed) => restored.add(&layer.table.apply_snapshot(parsed, now)),
                None => layer.table.forget_all(),
            }
        }
        restored.elapsed = elapsed.unwrap_or_default();
        restored.ignored_layers = ignored;
        Ok(restored)
    }
}
