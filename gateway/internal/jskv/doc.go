// Package jskv holds the gateway's JetStream key-value helpers:
// compare-and-swap edits of a record (ModifyCAS), retries of idempotent
// requests JetStream did not answer (Retry, Unanswered), watches that
// follow a bucket across outages (StartWatch, Follow), and the protected
// buckets the runtime users may not delete, update or purge
// (EnsureProtectedBucket). It imports nothing from the gateway.
package jskv
