//! What a file was written and not yet synced: the writes in the order they came, held in
//! memory over the backing file's content. Reads see them; `fsync` writes them to the backing
//! file; a power cut forgets them (or, torn, keeps a prefix of them in whole sectors).

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

/// The sector a torn power cut keeps or loses whole.
pub const SECTOR: u64 = 512;

/// One file's unsynced writes, oldest first. Writes that follow each other (an append after an
/// append) are kept as one.
#[derive(Debug, Default)]
pub struct Overlay {
    writes: Vec<(u64, Vec<u8>)>,
}

impl Overlay {
    /// Whether nothing is pending.
    pub fn is_empty(&self) -> bool {
        self.writes.is_empty()
    }

    /// Bytes pending.
    pub fn pending_bytes(&self) -> u64 {
        self.writes.iter().map(|(_, data)| data.len() as u64).sum()
    }

    /// Where the furthest pending write ends (0 when none is).
    pub fn end(&self) -> u64 {
        self.writes.iter().map(|(at, data)| at + data.len() as u64).max().unwrap_or(0)
    }

    /// The file's size as its readers see it, over a backing file of `backing_len` bytes.
    pub fn logical_len(&self, backing_len: u64) -> u64 {
        backing_len.max(self.end())
    }

    /// Holds a write of `data` at `offset`.
    pub fn write(&mut self, offset: u64, data: &[u8]) {
        if data.is_empty() {
            return;
        }
        if let Some((at, last)) = self.writes.last_mut() {
            if *at + last.len() as u64 == offset {
                last.extend_from_slice(data);
                return;
            }
        }
        self.writes.push((offset, data.to_vec()));
    }

    /// Up to `size` bytes at `offset`: the backing file's, with the pending writes over them
    /// (zeros where neither has any, below the logical size).
    pub fn read(&self, backing: &File, offset: u64, size: u32) -> io::Result<Vec<u8>> {
        let backing_len = backing.metadata()?.len();
        let len = self.logical_len(backing_len);
        if offset >= len {
            return Ok(Vec::new());
        }
        let n = (len - offset).min(size as u64) as usize;
        let mut buffer = vec![0u8; n];
        let from_backing = backing_len.saturating_sub(offset).min(n as u64) as usize;
        let mut done = 0;
        while done < from_backing {
            let read = backing.read_at(&mut buffer[done..from_backing], offset + done as u64)?;
            if read == 0 {
                break;
            }
            done += read;
        }
        let end = offset + n as u64;
        for (at, data) in &self.writes {
            let (start, stop) = ((*at).max(offset), (at + data.len() as u64).min(end));
            if start < stop {
                buffer[(start - offset) as usize..(stop - offset) as usize]
                    .copy_from_slice(&data[(start - at) as usize..(stop - at) as usize]);
            }
        }
        Ok(buffer)
    }

    /// Forgets what is pending at `size` and beyond (a truncation).
    pub fn discard_from(&mut self, size: u64) {
        self.discard_range(size, u64::MAX);
    }

    /// Forgets what is pending in `start..end` (a hole punched, a range zeroed).
    pub fn discard_range(&mut self, start: u64, end: u64) {
        let mut kept = Vec::with_capacity(self.writes.len());
        for (at, data) in self.writes.drain(..) {
            let stop = at + data.len() as u64;
            if stop <= start || at >= end {
                kept.push((at, data));
                continue;
            }
            if at < start {
                kept.push((at, data[..(start - at) as usize].to_vec()));
            }
            if stop > end {
                kept.push((end, data[(end - at) as usize..].to_vec()));
            }
        }
        self.writes = kept;
    }

    /// Writes everything pending to `backing`, in order, and forgets it (the caller syncs the
    /// file). On an error what was not written stays pending.
    pub fn persist(&mut self, backing: &File) -> io::Result<()> {
        for (done, (at, data)) in self.writes.iter().enumerate() {
            if let Err(e) = backing.write_all_at(data, *at) {
                self.writes.drain(..done);
                return Err(e);
            }
        }
        self.writes.clear();
        Ok(())
    }

    /// What a torn power cut leaves: a prefix of the pending writes reaches `backing`, the last
    /// one of it cut at a sector boundary of the file (whole sectors only), chosen by `pick(n)`
    /// (a number in `0..n`). The rest is forgotten. Returns the bytes kept.
    pub fn tear(&mut self, backing: &File, mut pick: impl FnMut(u64) -> u64) -> io::Result<u64> {
        // Every place the sequence of writes may stop at: after write `i`, `cut` bytes of the
        // file into it (its start, each sector boundary inside it, its end).
        let mut stops: Vec<(usize, u64)> = vec![(0, 0)];
        for (i, (at, data)) in self.writes.iter().enumerate() {
            let end = at + data.len() as u64;
            let mut boundary = (at / SECTOR + 1) * SECTOR;
            while boundary < end {
                stops.push((i, boundary));
                boundary += SECTOR;
            }
            stops.push((i + 1, 0));
        }
        let (whole, cut) = stops[pick(stops.len() as u64) as usize];
        let mut kept = 0;
        for (at, data) in &self.writes[..whole] {
            backing.write_all_at(data, *at)?;
            kept += data.len() as u64;
        }
        if cut > 0 {
            let (at, data) = &self.writes[whole];
            let part = &data[..(cut - at) as usize];
            backing.write_all_at(part, *at)?;
            kept += part.len() as u64;
        }
        self.writes.clear();
        Ok(kept)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(content: &[u8]) -> (tempfile::TempDir, File) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, content).unwrap();
        let file = File::options().read(true).write(true).open(&path).unwrap();
        (dir, file)
    }

    #[test]
    fn reads_see_pending_writes_over_the_backing_file() {
        let (_dir, backing) = file(b"0123456789");
        let mut overlay = Overlay::default();
        overlay.write(2, b"ab");
        overlay.write(12, b"xy");
        overlay.write(3, b"c");
        assert_eq!(overlay.logical_len(10), 14);
        assert_eq!(overlay.read(&backing, 0, 100).unwrap(), b"01ac456789\0\0xy");
        assert_eq!(overlay.read(&backing, 11, 2).unwrap(), b"\0x");
        assert_eq!(overlay.read(&backing, 14, 2).unwrap(), b"");
    }

    #[test]
    fn appends_are_kept_as_one_write() {
        let mut overlay = Overlay::default();
        overlay.write(0, b"ab");
        overlay.write(2, b"cd");
        overlay.write(10, b"e");
        assert_eq!(overlay.writes.len(), 2);
        assert_eq!(overlay.pending_bytes(), 5);
    }

    #[test]
    fn discarded_ranges_are_gone_and_the_rest_stays() {
        let (_dir, backing) = file(b"");
        let mut overlay = Overlay::default();
        overlay.write(0, b"abcdefgh");
        overlay.discard_range(2, 4);
        assert_eq!(overlay.read(&backing, 0, 100).unwrap(), b"ab\0\0efgh");
        overlay.discard_from(6);
        assert_eq!(overlay.read(&backing, 0, 100).unwrap(), b"ab\0\0ef");
    }

    #[test]
    fn persist_writes_in_order() {
        let (_dir, backing) = file(b"....");
        let mut overlay = Overlay::default();
        overlay.write(0, b"ab");
        overlay.write(1, b"X");
        overlay.persist(&backing).unwrap();
        assert!(overlay.is_empty());
        let mut content = vec![0; 4];
        backing.read_exact_at(&mut content, 0).unwrap();
        assert_eq!(content, b"aX..");
    }

    #[test]
    fn a_tear_keeps_a_prefix_of_whole_sectors() {
        for choice in 0..8 {
            let (_dir, backing) = file(b"");
            let mut overlay = Overlay::default();
            overlay.write(100, &[1u8; 1000]); // sectors 0, 1, 2
            overlay.write(5000, &[2u8; 10]);
            let kept = overlay.tear(&backing, |n| choice.min(n - 1)).unwrap();
            let len = backing.metadata().unwrap().len();
            // Stops: nothing; 412 bytes (to 512); 924 (to 1024); all 1000; and the second write.
            let expected = [(0, 0), (412, 512), (924, 1024), (1000, 1100), (1010, 5010)][choice.min(4) as usize];
            assert_eq!((kept, len), expected, "choice {choice}");
            assert!(overlay.is_empty());
        }
    }
}
