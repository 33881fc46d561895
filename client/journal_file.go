package client

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"
)

// FileJournalOptions configures OpenFileJournal.
type FileJournalOptions struct {
	// Warn hears what the journal recovered from, such as a last record
	// cut short by a crash in the middle of writing it (default: dropped).
	Warn func(string)
	// KeyRetention is how long an answered operation is kept when its
	// server never advertised its retention (default 24h, as
	// Config.KeyRetention): compaction on open drops the older ones.
	KeyRetention time.Duration
	// Now is the clock compaction reads (default time.Now).
	Now func() time.Time
}

// FileJournal is a Journal in one file, for a client whose keys must
// outlive its process. Each record is framed as a 4-byte length, a 4-byte
// CRC-32C of the payload and the payload (JSON), and the file is fsynced
// after each append: a record cut short by a crash is detected on open,
// reported to Warn and cut off, and every record before it is kept. It
// compacts on open, and again whenever it has grown to twice the records
// the last compaction kept (1,024 at least).
//
// The process that opens a FileJournal holds an exclusive lock (flock on
// path+".lock") until Close or its end, however it ends (the kernel drops
// the lock of a dead process, kill -9 included): two processes never run
// the operations of one journal at once, so one intent never runs twice
// concurrently. A second OpenFileJournal waits for the lock.
type FileJournal struct {
	path string
	lock *os.File
	warn func(string)

	// now and retention are OpenFileJournal's options, for compacting.
	now       func() time.Time
	retention time.Duration

	mu      sync.Mutex
	f       *os.File
	records []Record
	// compactAt is the number of records at which Append compacts: twice
	// what the last compaction kept, and minCompact at least.
	compactAt int
}

// minCompact is the fewest records at which a running journal compacts.
const minCompact = 1024

var _ Journal = (*FileJournal)(nil)

// maxRecord bounds one record's payload: a length over it is a torn or
// corrupt header, not a record to allocate for.
const maxRecord = 4 * MaxStoredBody

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// fsync makes a journal's writes durable. A test counts it: a write left
// unsynced survives any crash short of the machine's, so no kill test
// could tell it was missing.
var fsync = (*os.File).Sync

// OpenFileJournal opens (or creates) the journal at path, waiting until no
// other process holds it or ctx ends. On open it reads every record,
// drops a torn last one, and compacts: answered operations older than
// their retention go, operations never answered stay.
func OpenFileJournal(ctx context.Context, path string, opts FileJournalOptions) (*FileJournal, error) {
	if opts.Warn == nil {
		opts.Warn = func(string) {}
	}
	if opts.KeyRetention <= 0 {
		opts.KeyRetention = defaultKeyRetention
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	lock, err := lockFile(ctx, path+".lock")
	if err != nil {
		return nil, err
	}
	j := &FileJournal{path: path, lock: lock, warn: opts.Warn, now: opts.Now, retention: opts.KeyRetention}
	if err := j.load(opts.Now(), opts.KeyRetention); err != nil {
		_ = lock.Close()
		return nil, err
	}
	return j, nil
}

// load reads the file, cuts a torn tail off, compacts, and opens the file
// for appending.
func (j *FileJournal) load(now time.Time, retention time.Duration) error {
	data, err := os.ReadFile(j.path)
	created := errors.Is(err, os.ErrNotExist)
	if err != nil && !created {
		return fmt.Errorf("client: journal: %w", err)
	}
	records, good, torn := readRecords(data)
	if torn != "" {
		j.warn(fmt.Sprintf("journal %s: %s at byte %d; the %d records before it are kept", j.path, torn, good, len(records)))
	}
	kept, changed := compact(records, now, retention)
	j.compactAt = max(2*len(kept), minCompact)
	if changed || created || good != len(data) {
		// Rewrite to a temporary file and rename it over: a crash leaves
		// either the old journal or the new one, never half of one.
		f, err := j.rewrite(kept)
		if err != nil {
			if f != nil {
				_ = f.Close()
			}
			return err
		}
		j.f, j.records = f, kept
		return nil
	}
	f, err := os.OpenFile(j.path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return fmt.Errorf("client: journal: %w", err)
	}
	j.f, j.records = f, records
	return nil
}

// compactLocked compacts the journal of a process that runs for long: once
// it holds compactAt records, it keeps what compact keeps, rewritten as
// load does, and appends to the new file from then on. A failure leaves
// the journal as it was, and is reported to Warn.
func (j *FileJournal) compactLocked() {
	kept, changed := compact(j.records, j.now(), j.retention)
	j.compactAt = max(2*len(kept), minCompact)
	if !changed {
		return
	}
	f, err := j.rewrite(kept)
	if err != nil {
		j.warn(fmt.Sprintf("journal %s: compacting: %v", j.path, err))
	}
	if f == nil {
		return
	}
	_ = j.f.Close()
	j.f, j.records = f, kept
}

// rewrite writes records to a temporary file, fsyncs it and renames it
// over the journal, and returns it open for appending: the handle follows
// the file through the rename, so nothing can fail between the new
// journal taking the old one's place and the next append going to it. A
// file with an error means the rename happened and its directory's fsync
// failed.
func (j *FileJournal) rewrite(records []Record) (*os.File, error) {
	dir := filepath.Dir(j.path)
	tmp, err := os.CreateTemp(dir, filepath.Base(j.path)+".tmp*")
	if err != nil {
		return nil, fmt.Errorf("client: journal: %w", err)
	}
	defer os.Remove(tmp.Name()) // a no-op once renamed
	fail := func(err error) (*os.File, error) {
		_ = tmp.Close()
		return nil, fmt.Errorf("client: journal: %w", err)
	}
	var buf []byte
	for _, r := range records {
		if buf, err = appendFrame(buf, r); err != nil {
			return fail(err)
		}
	}
	if _, err := tmp.Write(buf); err != nil {
		return fail(err)
	}
	if err := fsync(tmp); err != nil {
		return fail(err)
	}
	if err := os.Rename(tmp.Name(), j.path); err != nil {
		return fail(err)
	}
	// Renamed: the journal is the new file now, synced or not.
	return tmp, syncDir(dir)
}

// syncDir makes a file's creation or rename in dir durable.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("client: journal: %w", err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("client: journal: sync %s: %w", dir, err)
	}
	return nil
}

// Append writes rec and fsyncs the file before it returns.
func (j *FileJournal) Append(rec Record) error {
	frame, err := appendFrame(nil, rec)
	if err != nil {
		return err
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.f == nil {
		return errors.New("client: journal: closed")
	}
	if _, err := j.f.Write(frame); err != nil {
		return fmt.Errorf("client: journal: %w", err)
	}
	if err := fsync(j.f); err != nil {
		return fmt.Errorf("client: journal: %w", err)
	}
	j.records = append(j.records, rec)
	if len(j.records) >= j.compactAt {
		j.compactLocked()
	}
	return nil
}

// Records returns a copy of the records.
func (j *FileJournal) Records() []Record {
	j.mu.Lock()
	defer j.mu.Unlock()
	return slices.Clone(j.records)
}

// Close closes the file and lets the next process open the journal.
func (j *FileJournal) Close() error {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.f == nil {
		return nil
	}
	err := j.f.Close()
	j.f = nil
	return errors.Join(err, j.lock.Close())
}

func appendFrame(buf []byte, rec Record) ([]byte, error) {
	payload, err := json.Marshal(rec)
	if err != nil {
		return nil, fmt.Errorf("client: journal: %w", err)
	}
	if len(payload) > maxRecord {
		return nil, fmt.Errorf("client: journal: a record of %d bytes is over %d", len(payload), maxRecord)
	}
	buf = binary.LittleEndian.AppendUint32(buf, uint32(len(payload)))
	buf = binary.LittleEndian.AppendUint32(buf, crc32.Checksum(payload, castagnoli))
	return append(buf, payload...), nil
}

// readRecords decodes the frames of data. It stops at the first frame that
// is cut short or fails its checksum (the last write, torn by a crash),
// returning the records before it, the offset where it starts, and why.
func readRecords(data []byte) (records []Record, good int, torn string) {
	for good < len(data) {
		rest := data[good:]
		if len(rest) < 8 {
			return records, good, "a record header cut short"
		}
		n := int(binary.LittleEndian.Uint32(rest))
		if n > maxRecord {
			return records, good, "a record length out of range"
		}
		if len(rest) < 8+n {
			return records, good, "a record cut short"
		}
		payload := rest[8 : 8+n]
		if crc32.Checksum(payload, castagnoli) != binary.LittleEndian.Uint32(rest[4:]) {
			return records, good, "a record failing its checksum"
		}
		var rec Record
		if err := json.Unmarshal(payload, &rec); err != nil {
			return records, good, "a record that does not decode"
		}
		records = append(records, rec)
		good += 8 + n
	}
	return records, good, ""
}

var _ io.Closer = (*FileJournal)(nil)
