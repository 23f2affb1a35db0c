//go:build race

package ha

// raceDetector: the tests run under the race detector, several times
// slower.
const raceDetector = true
