//go:build unix

package agent

import (
	"bytes"
	"encoding/binary"
	"hash/crc32"
	"image"
	"image/color"
	"image/color/palette"
	"image/gif"
	"image/jpeg"
	"image/png"
	"math/rand/v2"
	"testing"
)

// Images are made in code: each helper below builds a real file of its
// format with the standard or x/image encoders, or, where no encoder
// exists (WebP, APNG, EXIF), by writing the format's bytes as its
// specification lays them out.

// solid returns a w by h image of one colour.
func solid(w, h int, c color.NRGBA) *image.NRGBA {
	m := image.NewNRGBA(image.Rect(0, 0, w, h))
	for i := 0; i < len(m.Pix); i += 4 {
		m.Pix[i], m.Pix[i+1], m.Pix[i+2], m.Pix[i+3] = c.R, c.G, c.B, c.A
	}
	return m
}

var (
	red   = color.NRGBA{255, 0, 0, 255}
	green = color.NRGBA{0, 255, 0, 255}
	blue  = color.NRGBA{0, 0, 255, 255}
	white = color.NRGBA{255, 255, 255, 255}
)

// quadrants returns a w by h image whose quadrants are, clockwise from
// the top left, red, green, white and blue.
func quadrants(w, h int) *image.NRGBA {
	m := image.NewNRGBA(image.Rect(0, 0, w, h))
	for y := range h {
		for x := range w {
			c := red
			switch {
			case x >= w/2 && y < h/2:
				c = green
			case x >= w/2:
				c = white
			case y >= h/2:
				c = blue
			}
			m.SetNRGBA(x, y, c)
		}
	}
	return m
}

// noise returns a w by h opaque image of random pixels, which compress
// badly.
func noise(w, h int, seed uint64) *image.NRGBA {
	r := rand.New(rand.NewPCG(seed, 1))
	m := image.NewNRGBA(image.Rect(0, 0, w, h))
	for i := range m.Pix {
		m.Pix[i] = uint8(r.Uint32())
		if i%4 == 3 {
			m.Pix[i] = 255
		}
	}
	return m
}

func encodePNG(t testing.TB, m image.Image) []byte {
	t.Helper()
	var b bytes.Buffer
	if err := png.Encode(&b, m); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

func encodeJPEG(t testing.TB, m image.Image, quality int) []byte {
	t.Helper()
	var b bytes.Buffer
	if err := jpeg.Encode(&b, m, &jpeg.Options{Quality: quality}); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// exifSegment returns a JPEG APP1 segment holding an EXIF block whose
// IFD0 has the Orientation tag o (a SHORT), in the given byte order.
func exifSegment(o uint16, bo binary.AppendByteOrder) []byte {
	tiffHead := []byte("MM\x00*")
	if bo == binary.LittleEndian {
		tiffHead = []byte("II*\x00")
	}
	body := append([]byte("Exif\x00\x00"), tiffHead...)
	body = bo.AppendUint32(body, 8) // IFD0 right after the header
	body = bo.AppendUint16(body, 2) // two entries
	// An unrelated tag first (ImageDescription, ASCII, 4 bytes inline).
	body = bo.AppendUint16(body, 0x010E)
	body = bo.AppendUint16(body, 2)
	body = bo.AppendUint32(body, 4)
	body = append(body, "abc\x00"...)
	body = bo.AppendUint16(body, tagOrientation)
	body = bo.AppendUint16(body, 3) // SHORT
	body = bo.AppendUint32(body, 1)
	body = bo.AppendUint16(body, o)
	body = bo.AppendUint16(body, 0) // padding of the value field
	body = bo.AppendUint32(body, 0) // no next IFD
	seg := []byte{0xFF, 0xE1}
	seg = binary.BigEndian.AppendUint16(seg, uint16(len(body)+2))
	return append(seg, body...)
}

// withEXIF inserts seg after the SOI marker of a JPEG file.
func withEXIF(jpg, seg []byte) []byte {
	return append(append(append([]byte{}, jpg[:2]...), seg...), jpg[2:]...)
}

// pngChunk returns a PNG chunk with its length and CRC.
func pngChunk(typ string, data []byte) []byte {
	c := binary.BigEndian.AppendUint32(nil, uint32(len(data)))
	c = append(c, typ...)
	c = append(c, data...)
	return binary.BigEndian.AppendUint32(c, crc32.ChecksumIEEE(c[4:]))
}

// apng turns a PNG file into an animated PNG by adding an animation
// control chunk (acTL: 2 frames, looping forever) after IHDR.
func apng(p []byte) []byte {
	const afterIHDR = 8 + 8 + 13 + 4
	actl := pngChunk("acTL", binary.BigEndian.AppendUint32(binary.BigEndian.AppendUint32(nil, 2), 0))
	return append(append(append([]byte{}, p[:afterIHDR]...), actl...), p[afterIHDR:]...)
}

// bitWriter writes bits least significant first, as VP8L reads them.
type bitWriter struct {
	buf []byte
	acc uint64
	n   uint
}

func (w *bitWriter) write(v uint64, bits uint) {
	w.acc |= v << w.n
	w.n += bits
	for w.n >= 8 {
		w.buf = append(w.buf, byte(w.acc))
		w.acc >>= 8
		w.n -= 8
	}
}

func (w *bitWriter) bytes() []byte {
	if w.n > 0 {
		w.buf = append(w.buf, byte(w.acc))
		w.acc, w.n = 0, 0
	}
	return w.buf
}

// solidWebP returns a lossless WebP file (a VP8L bitstream in a RIFF
// container) of w by h pixels of colour c. Every prefix code has a
// single symbol, so the pixels take no bits at all: the bitstream is the
// header and five codes. See the WebP lossless bitstream specification,
// sections 3 (header), 4 (no transform), 5 and 6 (codes).
func solidWebP(w, h int, c color.NRGBA) []byte {
	var bw bitWriter
	bw.write(0x2f, 8) // signature
	bw.write(uint64(w-1), 14)
	bw.write(uint64(h-1), 14)
	alpha := uint64(0)
	if c.A != 255 {
		alpha = 1
	}
	bw.write(alpha, 1)
	bw.write(0, 3) // version
	bw.write(0, 1) // no transform
	bw.write(0, 1) // no colour cache
	bw.write(0, 1) // no meta prefix codes
	for _, sym := range []uint8{c.G, c.R, c.B, c.A} {
		bw.write(1, 1) // simple code
		bw.write(0, 1) // one symbol
		bw.write(1, 1) // of 8 bits
		bw.write(uint64(sym), 8)
	}
	bw.write(1, 1) // distance code: simple, one symbol of 1 bit: 0
	bw.write(0, 1)
	bw.write(0, 1)
	bw.write(0, 1)
	data := bw.bytes()
	chunk := append([]byte("VP8L"), binary.LittleEndian.AppendUint32(nil, uint32(len(data)))...)
	chunk = append(chunk, data...)
	if len(data)%2 == 1 {
		chunk = append(chunk, 0)
	}
	file := append([]byte("RIFF"), binary.LittleEndian.AppendUint32(nil, uint32(4+len(chunk)))...)
	return append(append(file, "WEBP"...), chunk...)
}

// animatedGIF returns a GIF of w by h with one frame per colour.
func animatedGIF(t testing.TB, w, h int, colours ...color.NRGBA) []byte {
	t.Helper()
	g := &gif.GIF{}
	for _, c := range colours {
		f := image.NewPaletted(image.Rect(0, 0, w, h), palette.Plan9)
		idx := uint8(color.Palette(palette.Plan9).Index(c))
		for i := range f.Pix {
			f.Pix[i] = idx
		}
		g.Image = append(g.Image, f)
		g.Delay = append(g.Delay, 10)
	}
	var b bytes.Buffer
	if err := gif.EncodeAll(&b, g); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}
