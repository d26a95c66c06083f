/* hyla_store_test.h — fault injection into the RocksDB store, for tests only
 * (tests/test_store.c). Not part of the store's interface: products never call it. A
 * process-wide counter (atomic). */
#ifndef HYLA_STORE_TEST_H
#define HYLA_STORE_TEST_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct hyla_store hyla_store;

/* The nth RocksDB write (chunk batch or commit batch) from now fails as if the disk were full
 * (HYLA_ERR_RESOURCE; the store then recovers as from a full disk); 0 disables. (zstd faults: hyla_codec_fault_zstd in hyla_codec_test.h.) */
void hyla_store_fault_write(long nth);

/* Asks RocksDB to flush st's memtables in the background, as it does by itself when a memtable
 * fills, without any call waiting for the result; waits (at most 10 s) until no flush is pending
 * or running, and returns RocksDB's count of failed background jobs since the store last
 * (re)opened it. */
uint64_t hyla_store_test_flush_background(hyla_store *st);

#ifdef __cplusplus
}
#endif
#endif
