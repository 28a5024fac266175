// Units: how numbers read in the window ("1.2 GiB", "340 MiB/s").
pragma Singleton
import QtQml

QtObject {
    function bytes(value: double): string {
        const kib = 1024, mib = kib * 1024, gib = mib * 1024
        if (value >= gib) return (value / gib).toFixed(value >= 100 * gib ? 0 : 1) + " GiB"
        if (value >= mib) return (value / mib).toFixed(value >= 100 * mib ? 0 : 1) + " MiB"
        if (value >= kib) return (value / kib).toFixed(0) + " KiB"
        return Math.max(0, Math.round(value)) + " B"
    }
    // Transfer rates in decimal units, as PCIe is quoted: "3.1 GB/s", "840 MB/s".
    function rate(bytesPerSecond: double): string {
        const v = Math.max(0, bytesPerSecond)
        if (v >= 1e9) return (v / 1e9).toFixed(v >= 100e9 ? 0 : 1) + " GB/s"
        if (v >= 1e6) return (v / 1e6).toFixed(0) + " MB/s"
        if (v >= 1e3) return (v / 1e3).toFixed(0) + " kB/s"
        return Math.round(v) + " B/s"
    }
    // A count with the locale's digit grouping: "12,345".
    function count(value: double): string {
        return Math.round(value).toLocaleString(Qt.locale(), "f", 0)
    }
}
