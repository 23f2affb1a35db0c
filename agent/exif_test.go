//go:build unix

package agent

import (
	"bytes"
	"encoding/binary"
	"image/jpeg"
	"testing"
)

func TestJPEGOrientation(t *testing.T) {
	base := encodeJPEG(t, solid(8, 8, red), 90)
	seg6 := exifSegment(6, binary.BigEndian)
	// An EXIF block whose orientation entry is a LONG, as a few tools
	// write it.
	long := exifSegment(8, binary.LittleEndian)
	long[4+6+8+2+12+2] = 4 // the second entry's type
	// Another APP segment first (JFIF APP0), and fill bytes before the
	// EXIF marker.
	app0 := []byte{0xFF, 0xE0, 0x00, 0x07, 'J', 'F', 'I', 'F', 0}
	tests := []struct {
		name string
		data []byte
		want int
	}{
		{"no exif", base, 1},
		{"orientation 6, big-endian", withEXIF(base, seg6), 6},
		{"orientation 3, little-endian", withEXIF(base, exifSegment(3, binary.LittleEndian)), 3},
		{"orientation as LONG", withEXIF(base, long), 8},
		{"after APP0 and fill bytes", withEXIF(base, append(append(app0, 0xFF, 0xFF), seg6...)), 6},
		{"first exif wins", withEXIF(base, append(exifSegment(5, binary.BigEndian), seg6...)), 5},
		{"orientation 0 is invalid", withEXIF(base, exifSegment(0, binary.BigEndian)), 1},
		{"orientation 9 is invalid", withEXIF(base, exifSegment(9, binary.BigEndian)), 1},
		{"exif after the scan is ignored", append(base[:len(base)-2:len(base)-2], append(seg6, 0xFF, 0xD9)...), 1},
		{"truncated segment", withEXIF(base, seg6)[:20], 1},
		{"segment length past the end", append([]byte{0xFF, 0xD8}, 0xFF, 0xE1, 0xFF, 0xFF, 'E', 'x'), 1},
		{"segment length below 2", append([]byte{0xFF, 0xD8}, 0xFF, 0xE1, 0x00, 0x01, 0, 0), 1},
		{"not a jpeg", seg6, 1},
		{"empty", nil, 1},
	}
	for _, tt := range tests {
		if got := jpegOrientation(tt.data); got != tt.want {
			t.Errorf("%s: orientation %d, want %d", tt.name, got, tt.want)
		}
	}
	// The files with a valid orientation are still JPEGs that decode.
	for _, tt := range tests[:6] {
		if _, err := jpeg.DecodeConfig(bytes.NewReader(tt.data)); err != nil {
			t.Errorf("%s: the test file does not decode: %v", tt.name, err)
		}
	}
}

func TestTIFFOrientation(t *testing.T) {
	body := exifSegment(7, binary.BigEndian)[4+6:] // the TIFF structure alone
	tests := []struct {
		name string
		data []byte
		want int
	}{
		{"valid", body, 7},
		{"IFD offset past the end", append(append([]byte{}, body[:4]...), 0xFF, 0xFF, 0xFF, 0xF0), 0},
		{"IFD offset inside the header", append(append([]byte{}, body[:4]...), 0, 0, 0, 4), 0},
		{"entries cut off", body[:8+2+12+6], 0},
		{"bad byte order", append([]byte("XX"), body[2:]...), 0},
		{"short", body[:7], 0},
	}
	for _, tt := range tests {
		if got := tiffOrientation(tt.data); got != tt.want {
			t.Errorf("%s: orientation %d, want %d", tt.name, got, tt.want)
		}
	}
}

// FuzzEXIFOrientation checks that the EXIF parsers never panic, return
// only valid orientations and allocate nothing, whatever the bytes.
func FuzzEXIFOrientation(f *testing.F) {
	base := encodeJPEG(f, solid(8, 8, red), 90)
	f.Add(withEXIF(base, exifSegment(6, binary.BigEndian)))
	f.Add(withEXIF(base, exifSegment(3, binary.LittleEndian)))
	f.Add(exifSegment(2, binary.BigEndian)[4+6:])
	f.Add([]byte{0xFF, 0xD8, 0xFF, 0xE1, 0x00, 0x08, 'E', 'x', 'i', 'f', 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		if o := jpegOrientation(b); o < 1 || o > 8 {
			t.Fatalf("jpegOrientation = %d, want 1 to 8", o)
		}
		if o := tiffOrientation(b); o < 0 || o > 8 {
			t.Fatalf("tiffOrientation = %d, want 0 to 8", o)
		}
		if n := testing.AllocsPerRun(1, func() { jpegOrientation(b); tiffOrientation(b) }); n != 0 {
			t.Fatalf("the EXIF parsers allocated %v times", n)
		}
	})
}
