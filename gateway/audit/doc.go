// Package audit keeps the gateway's audit trail: one record per tool call
// (Record), allowed or refused, stored in a JetStream stream before the
// call is answered (Trail.Write, Trail.Commit, Trail.WaitStored) and
// optionally appended to a JSON-lines file; each record sealed
// (Sealer) and chained to the one stored before it, so that reading the
// chain (Trail.VerifyChain) proves the trail whole; the stream watched
// for damage (Trail.Damages); the records read back (Trail.Query) and
// their arguments summarised with secrets blanked (ArgsSummary).
//
// It imports nothing from the gateway but gateway/internal/jskv: the
// gateway gives it what else it needs (the seal, the stream update with
// an admin credential, the logger) in Options.
package audit
