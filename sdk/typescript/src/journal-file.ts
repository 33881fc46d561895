/**
 * A key journal in a file, for Node.js: `@oncekey/sdk/journal-file`. It is a
 * subpath of its own so that the main entry, which browsers bundle, never
 * imports `node:fs`.
 *
 * The file is append-only: one record a line, `<crc32 hex> <json>\n`, written
 * with one write and fsync'd before `append` resolves, so an entry is on disk
 * before its request is sent. A crash mid-write leaves a torn last record:
 * its CRC (or its JSON) does not check, so it is skipped with a warning and
 * every record before it is read as written. Opening compacts: answered
 * entries past their retention are dropped, and a torn tail is cut, by
 * writing a new file (temp, fsync, rename, fsync of the directory). So does
 * a journal that has grown to twice the records its last compaction kept
 * (1,024 at least), so that a process that runs for weeks keeps a file the
 * size of what is live.
 *
 * One process at a time holds a journal (see `openFileJournal`), so two
 * processes can never run one intent at once, and the lock dies with its
 * holder.
 */
import { createHash } from "node:crypto";
import fs from "node:fs";
import net from "node:net";
import path from "node:path";
import { JournalState, type Journal, type JournalAnswer, type JournalEntry } from "./journal.js";

/** How `openFileJournal` behaves; every field is optional. */
export interface FileJournalOptions {
  /** Told of every record skipped as torn or corrupt. Default: process.emitWarning. */
  onWarning?: (message: string) => void;
  /** How long to wait for another process to let go of the journal. Default 30 s. */
  lockTimeoutMs?: number;
  /**
   * How the journal is held. "socket" (the default on Linux): a Unix socket
   * in the abstract namespace named after the file's real path; the kernel
   * frees it the moment its process dies, kill -9 included, and nothing is
   * left on disk. "pidfile" (the default elsewhere, where there is no
   * abstract namespace): `<file>.lock` holding the holder's pid; a holder
   * whose pid is no longer running is gone. Its weaknesses: a pid reused by
   * an unrelated process keeps the stale lock held until that one exits, and
   * it works on one host only (pids of another host mean nothing).
   */
  lock?: "socket" | "pidfile";
  /** The time compaction judges retention by (tests). Default Date.now(). */
  now?: () => number;
}

/** Thrown when another process holds the journal for longer than lockTimeoutMs. */
export class JournalLockedError extends Error {
  override readonly name = "JournalLockedError";
  constructor(readonly file: string) {
    super(`journal ${file} is held by another process`);
  }
}

/** A file journal: a `Journal` with `close`, which lets other processes in. */
export interface FileJournal extends Journal {
  /** The file's path as given. */
  readonly file: string;
  /** Releases the lock and closes the file; the journal is unusable after. */
  close(): Promise<void>;
}

/**
 * Opens (creating when missing, readable by its owner only) the journal at `file`, waiting until no
 * other process holds it, then reads it and compacts it. Hold it for as long
 * as the process sends journaled requests; a process that must run in
 * parallel with another needs a journal of its own.
 */
export async function openFileJournal(file: string, options: FileJournalOptions = {}): Promise<FileJournal> {
  const warn = options.onWarning ?? ((m: string) => process.emitWarning(m, "OncekeyJournalWarning"));
  // Owner-only: the journal holds request and answer bodies.
  fs.closeSync(fs.openSync(file, "a", 0o600));
  const real = fs.realpathSync(file);
  const useSocket = (options.lock ?? (process.platform === "linux" ? "socket" : "pidfile")) === "socket";
  const deadline = Date.now() + (options.lockTimeoutMs ?? 30_000);
  const release = useSocket ? await holdSocket(real, deadline) : await holdPidFile(real, deadline);
  try {
    const journal = new FileJournalImpl(file, real, release, warn, options.now ?? Date.now);
    journal.load();
    return journal;
  } catch (err) {
    await release();
    throw err;
  }
}

/** One line of the file. */
type JournalRecord =
  | { a: JournalEntry } // an entry appended (after compaction, with its answer)
  | { r: string; answer: JournalAnswer } // an answer recorded
  | { t: string; ms: number } // an origin's retention
  | { f: string }; // an entry forgotten

/** The fewest records at which a running journal compacts. */
const MIN_COMPACT = 1024;

class FileJournalImpl implements FileJournal {
  readonly #state = new JournalState();
  #fd = -1;
  /** Records in the file, and the count at which a write compacts it. */
  #lines = 0;
  #compactAt = MIN_COMPACT;

  constructor(
    readonly file: string,
    private readonly real: string,
    private readonly release: () => Promise<void>,
    private readonly warn: (message: string) => void,
    private readonly now: () => number,
  ) {}

  /** Reads every good record, then compacts when anything is to be dropped or cut. */
  load(): void {
    const now = this.now();
    const { records, clean } = readRecords(fs.readFileSync(this.real), this.warn);
    for (const rec of records) this.#apply(rec);
    if (!clean || this.#state.anyExpired(now) || records.some((r) => "f" in r)) {
      this.#rewrite(now);
      return;
    }
    this.#fd = fs.openSync(this.real, "a");
    this.#lines = records.length;
    this.#compactAt = Math.max(MIN_COMPACT, 2 * records.length);
  }

  #apply(rec: JournalRecord): void {
    if ("a" in rec) this.#state.entries.set(rec.a.key, rec.a);
    else if ("r" in rec) this.#state.answer(rec.r, rec.answer);
    else if ("t" in rec) this.#state.retentions.set(rec.t, rec.ms);
    else this.#state.entries.delete(rec.f);
  }

  /** Appends one record durably: one write, then fsync, before it counts. */
  #write(rec: JournalRecord): void {
    if (this.#fd < 0) throw new Error(`journal ${this.file} is closed`);
    writeAll(this.#fd, encode(rec));
    fs.fsyncSync(this.#fd);
    this.#apply(structuredClone(rec));
    if (++this.#lines < this.#compactAt) return;
    try {
      this.#rewrite(this.now());
    } catch (err) {
      // The record is durable already; the journal stays as it was.
      this.#compactAt = this.#lines + MIN_COMPACT;
      this.warn(`journal ${this.file}: compacting: ${err instanceof Error ? err.message : String(err)}`);
    }
  }

  /** Writes the live state to a new file and puts it in place atomically. */
  #rewrite(now: number): void {
    this.#state.dropExpired(now);
    const lines = [...this.#state.entries.values()].map((e) => encode({ a: e }));
    for (const [t, ms] of this.#state.retentions) lines.push(encode({ t, ms }));
    const tmp = `${this.real}.compact-${process.pid}`;
    const fd = fs.openSync(tmp, "w", 0o600);
    try {
      writeAll(fd, Buffer.concat(lines));
      fs.fsyncSync(fd);
      fs.renameSync(tmp, this.real);
    } catch (err) {
      fs.closeSync(fd);
      fs.rmSync(tmp, { force: true });
      throw err;
    }
    // fd follows the file through the rename: the appends from now on go
    // to it, and nothing can fail between the new file taking the old
    // one's place and the next append.
    if (this.#fd >= 0) fs.closeSync(this.#fd);
    this.#fd = fd;
    this.#lines = lines.length;
    this.#compactAt = Math.max(MIN_COMPACT, 2 * lines.length);
    // The rename is durable only once the directory is. (Windows cannot
    // open a directory; NTFS journals the rename itself.)
    if (process.platform !== "win32") {
      const dir = fs.openSync(path.dirname(this.real), "r");
      try {
        fs.fsyncSync(dir);
      } finally {
        fs.closeSync(dir);
      }
    }
  }

  async append(entry: JournalEntry): Promise<void> {
    this.#write({ a: entry });
  }

  async record(key: string, answer: JournalAnswer): Promise<void> {
    this.#write({ r: key, answer });
  }

  async pending(): Promise<JournalEntry[]> {
    return this.#state.pending();
  }

  async byIntent(intent: string): Promise<JournalEntry | undefined> {
    return this.#state.byIntent(intent);
  }

  async setRetention(origin: string, ms: number): Promise<void> {
    if (this.#state.retentions.get(origin) !== ms) this.#write({ t: origin, ms });
  }

  async retention(origin: string): Promise<number | undefined> {
    return this.#state.retentions.get(origin);
  }

  async forget(key: string): Promise<void> {
    if (this.#state.entries.has(key)) this.#write({ f: key });
  }

  async compact(now = Date.now()): Promise<void> {
    this.#rewrite(now);
  }

  async close(): Promise<void> {
    if (this.#fd >= 0) fs.closeSync(this.#fd);
    this.#fd = -1;
    await this.release();
  }
}

function encode(rec: JournalRecord): Buffer {
  const json = Buffer.from(JSON.stringify(rec)); // JSON escapes newlines: one line
  return Buffer.concat([Buffer.from(`${crc32(json).toString(16).padStart(8, "0")} `), json, Buffer.from("\n")]);
}

/**
 * The records of a journal file. A record whose CRC or JSON does not check
 * is skipped with a warning: at the end, a write torn by a crash; elsewhere,
 * corruption. `clean` is false when anything was skipped or the last record
 * lacks its newline: the file then needs rewriting before appends follow.
 */
function readRecords(buf: Buffer, warn: (message: string) => void): { records: JournalRecord[]; clean: boolean } {
  const records: JournalRecord[] = [];
  let clean = true;
  for (let pos = 0; pos < buf.length; ) {
    const nl = buf.indexOf(0x0a, pos);
    const end = nl === -1 ? buf.length : nl;
    const rec = decode(buf.subarray(pos, end));
    if (rec) records.push(rec);
    else warn(`${nl === -1 ? "torn last" : "corrupt"} journal record at byte ${pos} (${end - pos} bytes) skipped`);
    if (!rec || nl === -1) clean = false;
    pos = end + 1;
  }
  return { records, clean };
}

function decode(line: Buffer): JournalRecord | undefined {
  if (line.length < 10 || line[8] !== 0x20) return undefined;
  const hex = line.subarray(0, 8).toString("latin1");
  if (!/^[0-9a-f]{8}$/.test(hex)) return undefined;
  const json = line.subarray(9);
  if (crc32(json) !== parseInt(hex, 16)) return undefined;
  try {
    const rec = JSON.parse(json.toString("utf8")) as unknown;
    return typeof rec === "object" && rec !== null ? (rec as JournalRecord) : undefined;
  } catch {
    return undefined;
  }
}

const CRC_TABLE = Array.from({ length: 256 }, (_, n) => {
  let c = n;
  for (let k = 0; k < 8; k++) c = c & 1 ? 0xedb88320 ^ (c >>> 1) : c >>> 1;
  return c >>> 0;
});

/** CRC-32 (IEEE 802.3, as zlib's), unsigned. */
function crc32(bytes: Uint8Array): number {
  let c = 0xffffffff;
  for (const b of bytes) c = CRC_TABLE[(c ^ b) & 0xff]! ^ (c >>> 8);
  return (c ^ 0xffffffff) >>> 0;
}

function writeAll(fd: number, buf: Buffer): void {
  for (let off = 0; off < buf.length; ) off += fs.writeSync(fd, buf, off);
}

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

/**
 * Holds the journal with a listening abstract-namespace Unix socket named
 * after its real path: listening fails with EADDRINUSE while another process
 * holds it, and the kernel closes it with its process however that dies.
 */
async function holdSocket(real: string, deadline: number): Promise<() => Promise<void>> {
  const name = `\0oncekey-journal-${createHash("sha256").update(real).digest("hex")}`;
  for (;;) {
    const server = net.createServer();
    const err = await new Promise<NodeJS.ErrnoException | undefined>((resolve) => {
      server.once("error", resolve);
      server.listen({ path: name }, () => resolve(undefined));
    });
    if (!err) {
      server.unref(); // holding the journal must not keep the process alive
      return () => new Promise<void>((resolve) => server.close(() => resolve()));
    }
    if (err.code !== "EADDRINUSE") throw err;
    if (Date.now() >= deadline) throw new JournalLockedError(real);
    await sleep(20);
  }
}

/**
 * Holds the journal with `<file>.lock` created exclusively, holding the pid.
 * A lock whose pid is not running is taken over. Between reading a stale pid
 * and removing its file another waiter may have done the same and taken the
 * lock; the re-read before unlink narrows that window but cannot close it.
 */
async function holdPidFile(real: string, deadline: number): Promise<() => Promise<void>> {
  const lockFile = `${real}.lock`;
  const mine = `${process.pid}\n`;
  for (;;) {
    try {
      fs.writeFileSync(lockFile, mine, { flag: "wx" });
      return async () => {
        if (readOrEmpty(lockFile) === mine) fs.rmSync(lockFile, { force: true });
      };
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== "EEXIST") throw err;
    }
    const held = readOrEmpty(lockFile);
    const pid = Number.parseInt(held, 10);
    // Empty for more than a second: its creator died between creating and writing it.
    const abandoned = held === "" ? ageMs(lockFile) > 1_000 : !isRunning(pid);
    if (abandoned && readOrEmpty(lockFile) === held) {
      fs.rmSync(lockFile, { force: true });
      continue;
    }
    if (Date.now() >= deadline) throw new JournalLockedError(real);
    await sleep(20);
  }
}

function ageMs(file: string): number {
  try {
    return Date.now() - fs.statSync(file).mtimeMs;
  } catch {
    return 0;
  }
}

function readOrEmpty(file: string): string {
  try {
    return fs.readFileSync(file, "utf8");
  } catch {
    return "";
  }
}

function isRunning(pid: number): boolean {
  if (!Number.isInteger(pid) || pid <= 0) return false;
  try {
    process.kill(pid, 0);
    return true;
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === "EPERM"; // alive, someone else's
  }
}
