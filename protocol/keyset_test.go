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
