package protocol

import (
	"bytes"
	"crypto/ed25519"
	"strings"
	"testing"
	"time"
)

func keyPair(b byte) (ed25519.PrivateKey, string) {
	priv := ed25519.NewKeyFromSeed(bytes.Repeat([]byte{b}, ed25519.SeedSize))
	return priv, FormatSigningKey(priv.Public().(ed25519.PublicKey))
}

// TestKeySetRotation: an agent that trusts K1 takes a rotation to K2
// signed by K1, then the retirement of K1 signed by K2; one that missed
// both catches up through the chain; a set no trusted key signs stops
// the walk.
func TestKeySetRotation(t *testing.T) {
	k1, p1 := keyPair(1)
	k2, p2 := keyPair(2)
	k3, p3 := keyPair(3)
	at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	rotate, err := SignKeySet(KeySet{Serial: 1, Keys: []string{p2, p1}, At: at}, k1, k2)
	if err != nil {
		t.Fatal(err)
	}
	retire, err := SignKeySet(KeySet{Serial: 2, Keys: []string{p2}, At: at.Add(time.Hour)}, k2)
	if err != nil {
		t.Fatal(err)
	}
	st := KeyState{Keys: []string{p1}}
	mid, err := st.Apply(&KeySetChain{Sets: []SignedKeySet{rotate}})
	if err != nil || mid.Serial != 1 || len(mid.Keys) != 2 {
		t.Fatalf("after the rotation: %+v, %v", mid, err)
	}
	end, err := mid.Apply(&KeySetChain{Sets: []SignedKeySet{rotate, retire}})
	if err != nil || end.Serial != 2 || len(end.Keys) != 1 || end.Keys[0] != p2 {
		t.Fatalf("after the retirement: %+v, %v", end, err)
	}
	if caught, err := st.Apply(&KeySetChain{Sets: []SignedKeySet{rotate, retire}}); err != nil || caught.Serial != 2 {
		t.Fatalf("an agent that missed both: %+v, %v", caught, err)
	}
	// An old set again changes nothing.
	if again, err := end.Apply(&KeySetChain{Sets: []SignedKeySet{rotate}}); err != nil || again.Serial != 2 {
		t.Errorf("an older set applied again: %+v, %v", again, err)
	}

	// A set signed only by a key the agent does not trust: the walk
	// stops, the state so far stays.
	rogue, _ := SignKeySet(KeySet{Serial: 3, Keys: []string{p3}, At: at}, k3)
	got, err := end.Apply(&KeySetChain{Sets: []SignedKeySet{rotate, retire, rogue}})
	if err == nil || !strings.Contains(err.Error(), "signed by none") || got.Serial != 2 {
		t.Errorf("a set signed by an unknown key: %+v, %v", got, err)
	}
	// A set whose content changed after signing.
	changed := retire
	changed.Set.Keys = []string{p3}
	if _, err := mid.Apply(&KeySetChain{Sets: []SignedKeySet{changed}}); err == nil {
		t.Error("a changed set was taken")
	}
	// A signature by a trusted key, but over another purpose.
	wrong := SignedKeySet{Set: KeySet{Serial: 3, Keys: []string{p3}, At: at},
		Signatures: []Signature{SignBytes(k2, PurposeDesired, (&KeySet{Serial: 3, Keys: []string{p3}, At: at}).CanonicalBytes())}}
	if _, err := end.Apply(&KeySetChain{Sets: []SignedKeySet{wrong}}); err == nil {
		t.Error("a signature for another purpose was taken")
	}
	for _, bad := range []KeySet{{Serial: 9}, {Serial: 9, Keys: []string{p1, p1}}, {Serial: 9, Keys: []string{"x"}}, {Serial: 9, Keys: []string{p1, p2, p3, p1, p2}}} {
		if _, err := SignKeySet(bad, k1); err == nil {
			t.Errorf("SignKeySet(%+v) accepted", bad)
		}
	}
}

// TestKeySetBounds: a set that skips serials is refused (a key that once
// signed could otherwise jump to a far serial and lock the host out of
// every later set), and one carrying more signatures than a set has keys
// is refused before any is checked; bogus signatures naming a trusted key
// cost one check for that key, not one each.
func TestKeySetBounds(t *testing.T) {
	k1, p1 := keyPair(1)
	_, p2 := keyPair(2)
	at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	st := KeyState{Keys: []string{p1}}
	jump, err := SignKeySet(KeySet{Serial: 1 << 40, Keys: []string{p2}, At: at}, k1)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := st.Apply(&KeySetChain{Sets: []SignedKeySet{jump}}); err == nil || !strings.Contains(err.Error(), "grow by one") || got.Serial != 0 {
		t.Errorf("a set that skips serials: %+v, %v", got, err)
	}
	set := KeySet{Serial: 1, Keys: []string{p2}, At: at}
	bogus := SignBytes(k1, PurposeKeySet, []byte("something else"))
	many := SignedKeySet{Set: set}
	for range MaxKeySetKeys + 1 {
		many.Signatures = append(many.Signatures, bogus)
	}
	if _, err := st.Apply(&KeySetChain{Sets: []SignedKeySet{many}}); err == nil || !strings.Contains(err.Error(), "signatures; at most") {
		t.Errorf("a set with %d signatures: %v", len(many.Signatures), err)
	}
	// Bogus signatures of one trusted key first, then a good one by the
	// same key: only the first of that key's is checked, so the set is
	// refused, at the cost of one check.
	good, _ := SignKeySet(set, k1)
	mixed := SignedKeySet{Set: set, Signatures: []Signature{bogus, bogus, good.Signatures[0]}}
	if _, err := st.Apply(&KeySetChain{Sets: []SignedKeySet{mixed}}); err == nil {
		t.Error("a set whose first signature by the trusted key is bogus was taken")
	}
	if got, err := st.Apply(&KeySetChain{Sets: []SignedKeySet{good}}); err != nil || got.Serial != 1 {
		t.Errorf("the genuine set: %+v, %v", got, err)
	}
}
