/* KV block files read straight into place, their checksums taken, with no Python between
   the bytes (engine/kv/frame_reads.py binds it; engine/kv_files/kv_frame.py is the format).

   Read in Python, a 2,000-token session's 125 block files cost ~7 ms of work under the GIL
   on top of the copy (each file's open, its 60 pieces' views, the checksum of each piece),
   and a float16 session read from the page cache took as long as a float32 one (see
   bench/RESULTS.md). Here one call reads a reader thread's share of a session's
   files: each opened and asked ahead (posix_fadvise WILLNEED, a batch at a time, so that
   the disk has every read queued at once), its header's frame prefix checked, its payload
   read by preadv straight into the pieces given (a pool's blocks), and its xxh3-64 taken.
   What the header says (JSON) is Python's to check; a file this call finds anything wrong
   with is read again by Python (block_file.read_block), which says precisely what.

   Only where the compiler finds xxHash's header (Debian: libxxhash-dev), used inline:
   wf_frame_reader() says whether this build has it. */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#if defined(__has_include)
#if __has_include(<xxhash.h>)
#define WF_FRAME_READ 1
#define XXH_INLINE_ALL
#include <xxhash.h>
#endif
#endif

#define PREFIX_BYTES 12 /* magic, u32 version, u32 header length (little-endian) */
#define ADVISE_BATCH 64 /* files open at once per call: their reads queued together */
#define IOV_CHUNK 512   /* pieces a preadv call takes (under every system's IOV_MAX) */

enum { FRAME_OK = 0, FRAME_BAD = 1 }; /* bad: missing, unreadable or found wrong */

#ifdef WF_FRAME_READ

int wf_frame_reader(void) { return 1; }

static uint32_t le32(const unsigned char *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* The payload at `offset`, `pieces` runs of `piece_bytes` each, read into `addrs`; 0 when
   every byte came. */
static int read_pieces(int fd, int64_t offset, const int64_t *addrs, int64_t pieces,
                       int64_t piece_bytes) {
    struct iovec iov[IOV_CHUNK];
    for (int64_t first = 0; first < pieces; first += IOV_CHUNK) {
        int64_t count = pieces - first < IOV_CHUNK ? pieces - first : IOV_CHUNK;
        for (int64_t j = 0; j < count; j++) {
            iov[j].iov_base = (void *)(intptr_t)addrs[first + j];
            iov[j].iov_len = (size_t)piece_bytes;
        }
        int64_t want = count * piece_bytes, got = 0;
        struct iovec *at = iov;
        int left = (int)count;
        while (got < want) { /* a short read: go on from where it stopped */
            ssize_t n = preadv(fd, at, left, (off_t)(offset + got));
            if (n < 0 && errno == EINTR) continue;
            if (n <= 0) return -1;
            got += n;
            while (left && (size_t)n >= at->iov_len) n -= (ssize_t)(at++)->iov_len, left--;
            if (left) at->iov_base = (char *)at->iov_base + n, at->iov_len -= (size_t)n;
        }
        offset += want;
    }
    return 0;
}

/* One opened frame: its prefix and header into `head` (head_cap bytes), its payload into
   place, its checksum; FRAME_OK or FRAME_BAD. */
static int read_frame(int fd, const char *magic, uint32_t version, char *head, int64_t head_cap,
                      int64_t *head_len, const int64_t *addrs, int64_t pieces,
                      int64_t piece_bytes, uint64_t *sum) {
    struct stat st;
    if (fstat(fd, &st) != 0) return FRAME_BAD;
    ssize_t n = pread(fd, head, (size_t)head_cap, 0);
    if (n < PREFIX_BYTES || memcmp(head, magic, 4) != 0) return FRAME_BAD;
    const unsigned char *u = (const unsigned char *)head;
    int64_t length = le32(u + 8), offset = PREFIX_BYTES + length;
    if (le32(u + 4) != version || offset > n) return FRAME_BAD; /* long headers: Python's */
    if ((int64_t)st.st_size - offset != pieces * piece_bytes) return FRAME_BAD;
    if (read_pieces(fd, offset, addrs, pieces, piece_bytes) != 0) return FRAME_BAD;
    XXH3_state_t state;
    XXH3_64bits_reset(&state);
    for (int64_t j = 0; j < pieces; j++)
        XXH3_64bits_update(&state, (const void *)(intptr_t)addrs[j], (size_t)piece_bytes);
    *sum = XXH3_64bits_digest(&state);
    *head_len = length;
    return FRAME_OK;
}

/* Read `n` frames (`paths`) of `magic` and `version`: frame i's header (after the prefix,
   head_lens[i] bytes) at heads + i * head_cap + 12, its payload into the `pieces` addresses
   addrs[i * pieces ...] of piece_bytes each, its xxh3-64 in sums[i], and how it went in
   status[i] (FRAME_OK, FRAME_BAD). */
void wf_read_frames(int64_t n, const char *const *paths, const char *magic, uint32_t version,
                    char *heads, int64_t head_cap, int64_t *head_lens, const int64_t *addrs,
                    int64_t pieces, int64_t piece_bytes, uint64_t *sums, int32_t *status) {
    int fds[ADVISE_BATCH];
    for (int64_t start = 0; start < n; start += ADVISE_BATCH) {
        int64_t count = n - start < ADVISE_BATCH ? n - start : ADVISE_BATCH;
        for (int64_t j = 0; j < count; j++) {
            fds[j] = open(paths[start + j], O_RDONLY | O_CLOEXEC);
#ifdef POSIX_FADV_WILLNEED
            if (fds[j] >= 0) posix_fadvise(fds[j], 0, 0, POSIX_FADV_WILLNEED);
#endif
        }
        for (int64_t j = 0; j < count; j++) {
            int64_t i = start + j;
            if (fds[j] < 0) {
                status[i] = FRAME_BAD;
                continue;
            }
            status[i] = read_frame(fds[j], magic, version, heads + i * head_cap, head_cap,
                                   head_lens + i, addrs + i * pieces, pieces, piece_bytes,
                                   sums + i);
            close(fds[j]);
        }
    }
}

#else

int wf_frame_reader(void) { return 0; }

#endif
