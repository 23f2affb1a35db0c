package agent

import "encoding/binary"

// EXIF orientation: how the stored pixels must be turned to stand
// upright. Values 1–8 as defined by the EXIF and TIFF specifications:
//
//	1 as stored          2 mirrored left-right      3 turned 180°
//	4 mirrored top-bottom 5 transposed (mirrored along the main diagonal)
//	6 turned 90° clockwise 7 transversed (mirrored along the other diagonal)
//	8 turned 90° counter-clockwise
//
// Orientations 5–8 swap width and height.

// tagOrientation is the TIFF tag that holds the orientation.
const tagOrientation = 0x0112

// jpegOrientation returns the EXIF orientation of the JPEG file b: the
// Orientation tag of IFD0 in the first APP1 "Exif" segment. It returns 1
// (as stored) when the file has none or it is not a value from 1 to 8.
// It reads only the segments before the first scan, checks every length
// against b and allocates nothing.
func jpegOrientation(b []byte) int {
	if len(b) < 4 || b[0] != 0xFF || b[1] != 0xD8 {
		return 1
	}
	p := 2
	for p+4 <= len(b) {
		if b[p] != 0xFF {
			return 1
		}
		m := b[p+1]
		switch {
		case m == 0xFF: // fill byte before a marker
			p++
			continue
		case m == 0x01 || m >= 0xD0 && m <= 0xD8: // markers without a length
			p += 2
			continue
		case m == 0xDA || m == 0xD9: // start of scan, end of image: no metadata after
			return 1
		}
		n := int(binary.BigEndian.Uint16(b[p+2:]))
		if n < 2 || p+2+n > len(b) {
			return 1
		}
		seg := b[p+4 : p+2+n]
		if m == 0xE1 && len(seg) >= 6 && string(seg[:6]) == "Exif\x00\x00" {
			if o := tiffOrientation(seg[6:]); o != 0 {
				return o
			}
			return 1
		}
		p += 2 + n
	}
	return 1
}

// tiffOrientation returns the Orientation tag of IFD0 of b, a TIFF
// structure (the body of an EXIF segment, or a whole TIFF file), or 0
// when it has none or an invalid one.
func tiffOrientation(b []byte) int {
	if len(b) < 8 {
		return 0
	}
	var bo binary.ByteOrder
	switch string(b[:4]) {
	case "II*\x00":
		bo = binary.LittleEndian
	case "MM\x00*":
		bo = binary.BigEndian
	default:
		return 0
	}
	off := uint64(bo.Uint32(b[4:]))
	if off < 8 || off+2 > uint64(len(b)) {
		return 0
	}
	entries := int(bo.Uint16(b[off:]))
	p := int(off) + 2
	for range entries {
		if p+12 > len(b) {
			return 0
		}
		e := b[p : p+12]
		p += 12
		if bo.Uint16(e) != tagOrientation {
			continue
		}
		var v uint32
		switch typ, count := bo.Uint16(e[2:]), bo.Uint32(e[4:]); {
		case count != 1:
			return 0
		case typ == 3: // SHORT, as the specification has it
			v = uint32(bo.Uint16(e[8:]))
		case typ == 4: // LONG, written by a few tools
			v = bo.Uint32(e[8:])
		default:
			return 0
		}
		if v < 1 || v > 8 {
			return 0
		}
		return int(v)
	}
	return 0
}
