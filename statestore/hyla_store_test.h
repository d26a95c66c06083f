/* hyla_store_test.h — fault injection into the RocksDB store, for tests only
 * (tests/test_store.c). Not part of the store's interface: products never call it. A
 * process-wide counter (atomic). */
#ifndef HYLA_STORE_TEST_H
#define HYLA_STORE_TEST_H

#ifdef __cplusplus
extern "C" {
#endif

/* The nth RocksDB write (chunk batch or commit batch) from now fails as if the disk were full
 * (HYLA_ERR_RESOURCE; the store then recovers as from a full disk); 0 disables. (zstd faults: hyla_codec_fault_zstd in hyla_codec_test.h.) */
void hyla_store_fault_write(long nth);

#ifdef __cplusplus
}
#endif
#endif
